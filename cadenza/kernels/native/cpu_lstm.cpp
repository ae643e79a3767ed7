// One LSTM layer over a ragged batch of streams on the CPU, in one call: the layer of a
// streaming codec decoder (EnCodec's two-layer LSTM at the frame rate), each stream carrying
// its own state from call to call.
//
// Row b of the batch holds lengths[b] valid time steps of its stream (the rest is padding).
// The input products of every row and step are one product; then step by step, only the rows
// still running: their recurrent product, the gates (PyTorch's order: input, forget, cell,
// output) and the new state. Rows are taken longest first, so the running rows are always the
// first ones and each step is one product over them. A row's state is its state after its own
// last step; its padding steps output zeros.
//
// torch's CPU LSTM runs a ragged (packed) batch one step and one product at a time, reordering
// the weights for each, and a uniform batch through oneDNN's RNN, which reorders every weight
// on each call: 2-3 ms a call of one stream, and half again for a ragged batch of the same
// frames (docs/benchmarks.md). Here the weights are packed once (cpu_product.h's layouts), the
// state is float32 whatever the weights, and nothing is allocated but scratch that stays.
//
// Numbers: float32 activations, gates and state; float32 or bfloat16 weights (on a CPU with
// AVX512-BF16, the products' inputs rounded to bfloat16 as oneDNN's bf16 products do). The
// sigmoid is 1 / (1 + e^-x) and tanh(x) = 2 sigmoid(2x) - 1, with cpu_vector.h's exponential.

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <vector>

#include "cpu_product.h"
#include "cpu_vector.h"

namespace {

inline f32v sigmoid(f32v x) { return splat(1.0f) / (splat(1.0f) + exp_lanes(-x)); }

inline f32v tanh_lanes(f32v x) { return splat(2.0f) * sigmoid(splat(2.0f) * x) - splat(1.0f); }

// The gates of `rows` rows (each 4H wide: input, forget, cell, output) into their new cell and
// hidden state; H % LANES == 0.
void update_state(const float* gates, int rows, int H, float* c, float* h) {
    for (int j = 0; j < rows; ++j) {
        const float* g = gates + (size_t)j * 4 * H;
        float* cj = c + (size_t)j * H;
        float* hj = h + (size_t)j * H;
        for (int i = 0; i < H; i += LANES) {
            const f32v in = sigmoid(load(g + i));
            const f32v forget = sigmoid(load(g + H + i));
            const f32v cell = tanh_lanes(load(g + 2 * H + i));
            const f32v out = sigmoid(load(g + 3 * H + i));
            const f32v next = forget * load(cj + i) + in * cell;
            store(cj + i, next);
            store(hj + i, out * tanh_lanes(next));
        }
    }
}

template <typename Weight>
void lstm_layer(const float* x, int B, int T, const int32_t* lengths, int K, int H,
                const Weight* w_ih, const Weight* w_hh, const float* bias, float* h, float* c,
                float* y) {
    const int G = 4 * H;
    thread_local std::vector<float> input_gates, gates, hs, cs;
    thread_local std::vector<int> order;
    input_gates.resize((size_t)B * T * G);
    gates.resize((size_t)B * G);
    hs.resize((size_t)B * H);
    cs.resize((size_t)B * H);
    order.resize(B);
    // Every row's every step at once: x [B * T, K] -> [B * T, 4H], plus the biases.
    product(x, B * T, K, w_ih, G, K, input_gates.data(), G, false);
    // Longest rows first: the rows still running at step t are the first `running` ones.
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](int a, int b) { return lengths[a] > lengths[b]; });
    for (int j = 0; j < B; ++j) {
        std::memcpy(hs.data() + (size_t)j * H, h + (size_t)order[j] * H, sizeof(float) * H);
        std::memcpy(cs.data() + (size_t)j * H, c + (size_t)order[j] * H, sizeof(float) * H);
    }
    std::memset(y, 0, sizeof(float) * (size_t)B * T * H);
    int running = B;
    for (int t = 0; t < T; ++t) {
        while (running > 0 && lengths[order[running - 1]] <= t) --running;
        if (running == 0) break;
        for (int j = 0; j < running; ++j) {
            const float* from = input_gates.data() + ((size_t)order[j] * T + t) * G;
            float* to = gates.data() + (size_t)j * G;
            for (int i = 0; i < G; i += LANES) store(to + i, load(from + i) + load(bias + i));
        }
        product(hs.data(), running, H, w_hh, G, H, gates.data(), G, true);
        update_state(gates.data(), running, H, cs.data(), hs.data());
        for (int j = 0; j < running; ++j)
            std::memcpy(y + ((size_t)order[j] * T + t) * H, hs.data() + (size_t)j * H,
                        sizeof(float) * H);
    }
    for (int j = 0; j < B; ++j) {
        std::memcpy(h + (size_t)order[j] * H, hs.data() + (size_t)j * H, sizeof(float) * H);
        std::memcpy(c + (size_t)order[j] * H, cs.data() + (size_t)j * H, sizeof(float) * H);
    }
}

}  // namespace

extern "C" {

// One layer: x [B, T, K] float32 (row b's step t at (b * T + t) * K), lengths [B] (0..T),
// weights packed (w_ih [4H, K], w_hh [4H, H]: cpu_product.h), bias [4H] (b_ih + b_hh), state
// h, c [B, H] float32 read and replaced, y [B, T, H] float32 written (zeros past a row's
// length). H % 16 == 0; with bfloat16 pairs, K and H even.
void cadenza_lstm_layer_f32(const float* x, int B, int T, const int32_t* lengths, int K, int H,
                            const float* w_ih, const float* w_hh, const float* bias, float* h,
                            float* c, float* y) {
    lstm_layer(x, B, T, lengths, K, H, w_ih, w_hh, bias, h, c, y);
}

void cadenza_lstm_layer_bf16(const float* x, int B, int T, const int32_t* lengths, int K, int H,
                             const uint16_t* w_ih, const uint16_t* w_hh, const float* bias,
                             float* h, float* c, float* y) {
    lstm_layer(x, B, T, lengths, K, H, w_ih, w_hh, bias, h, c, y);
}

// Whether bfloat16 weights are packed in pairs along k on this CPU (cpu_product.h).
int cadenza_lstm_weight_pairs() { return WEIGHT_PAIRS ? 1 : 0; }

}  // extern "C"
