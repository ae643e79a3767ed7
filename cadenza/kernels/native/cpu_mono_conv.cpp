// A 1-D convolution to one output channel over time-major input, on the CPU: the last layer of
// every SEANet codec decoder (EnCodec, Mimi), which turns its few channels into the waveform.
//
// oneDNN runs a convolution with one output channel at a few GMAC/s (there is nothing to block
// the output over): a tenth of the decoder's time for a hundredth of its multiply-adds. In
// time-major storage ([B, T, C], channels contiguous) the window an output reads is k rows of C
// channels, one block of memory where the dilation is 1: each output is a dot product of the
// window with the weight, C lanes at a time, accumulated in float32.

#include <cstdint>

#include "cpu_vector.h"

namespace {

constexpr int64_t PARALLEL_OUTPUTS = 1 << 16;

inline f32v load_input(const float* p) { return load(p); }

inline f32v load_input(const uint16_t* p) { return load_bf16(p); }

// Four outputs at a time: four independent chains of multiply-adds (one chain waits on each
// add's latency) sharing each weight load.
constexpr int OUTPUTS = 4;

// out[b, t] = bias + sum_{j, c} w[j, c] * x[b, t + j * dilation, c], for t < L - (k-1)*dilation.
template <typename In>
void mono_conv(const In* x, int B, int L, int C, const float* w, int k, int dilation,
               float bias, float* out) {
    const int T = L - (k - 1) * dilation;
    if (T <= 0) return;
#pragma omp parallel for schedule(static) if ((int64_t)B * T >= PARALLEL_OUTPUTS)
    for (int b = 0; b < B; ++b) {
        const In* row = x + (size_t)b * L * C;
        float* y = out + (size_t)b * T;
        int t = 0;
        for (; t + OUTPUTS <= T; t += OUTPUTS) {
            f32v sums[OUTPUTS] = {};
            for (int j = 0; j < k; ++j) {
                const In* window = row + (size_t)(t + j * dilation) * C;
                for (int c = 0; c < C; c += LANES) {
                    const f32v weight = load(w + (size_t)j * C + c);
                    for (int i = 0; i < OUTPUTS; ++i)
                        sums[i] += load_input(window + (size_t)i * C + c) * weight;
                }
            }
            for (int i = 0; i < OUTPUTS; ++i) y[t + i] = sum_lanes(sums[i]) + bias;
        }
        for (; t < T; ++t) {
            f32v sum = f32v{};
            for (int j = 0; j < k; ++j) {
                const In* window = row + (size_t)(t + j * dilation) * C;
                for (int c = 0; c < C; c += LANES) sum += load_input(window + c) * load(w + j * C + c);
            }
            y[t] = sum_lanes(sum) + bias;
        }
    }
}

}  // namespace

extern "C" {

// x: [B, L, C] float32 (time-major), w: [k, C] float32 (w[j, c] is the weight of input channel
// c at tap j), out: [B, L - (k - 1) * dilation] float32. C % 16 == 0.
void cadenza_mono_conv_f32(const float* x, int B, int L, int C, const float* w, int k,
                           int dilation, float bias, float* out) {
    mono_conv(x, B, L, C, w, k, dilation, bias, out);
}

// The same with bfloat16 x (``uint16_t`` bit patterns), widened exactly.
void cadenza_mono_conv_bf16(const uint16_t* x, int B, int L, int C, const float* w, int k,
                            int dilation, float bias, float* out) {
    mono_conv(x, B, L, C, w, k, dilation, bias, out);
}

}  // extern "C"
