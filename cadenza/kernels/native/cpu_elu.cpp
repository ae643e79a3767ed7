// ELU over a buffer of float32 or bfloat16, the activation every SEANet codec decoder (EnCodec,
// Mimi) applies before its convolutions: ``x > 0 ? x : alpha * (e^x - 1)``.
//
// torch's CPU ELU evaluates ``expm1`` one element at a time (1.5-1.7 ns an element on the
// machines measured in docs/benchmarks.md, more than the convolutions that follow it at a
// codec's high-rate end); this is the same function a vector at a time, ``e^x - 1`` by
// range reduction and a polynomial that keeps its precision near 0: float32 results within a
// few ulp of ``expm1``; bfloat16 ones computed in float32 and rounded
// to nearest even, as torch's are. NaN stays NaN. The buffer is any tensor's dense storage:
// the function is elementwise, so layout does not matter.

#include <cstdint>

#include "cpu_vector.h"

namespace {

constexpr int64_t PARALLEL_ELEMENTS = 1 << 18;

// e^x - 1 for x <= 0 as 2^n (e^r - 1) + (2^n - 1), r = x - n ln 2 in [-ln2/2, ln2/2]: the
// polynomial for e^r - 1 has no cancellation near 0, and neither has the sum for n = 0.
inline f32v expm1_negative(f32v x) {
    const f32v magic = splat(12582912.0f);  // 1.5 * 2^23: adding it rounds to an integer
    x = x < splat(-87.0f) ? splat(-87.0f) : x;  // 2^n stays a normal float; e^-87 - 1 = -1
    const f32v shifted = x * splat(1.44269504088896341f) + magic;
    const f32v n = shifted - magic;
    const f32v r = x - n * splat(0.693359375f) - n * splat(-2.12194440e-4f);
    f32v p = splat(1.0f / 5040.0f);
    p = p * r + splat(1.0f / 720.0f);
    p = p * r + splat(1.0f / 120.0f);
    p = p * r + splat(1.0f / 24.0f);
    p = p * r + splat(1.0f / 6.0f);
    p = p * r + splat(0.5f);
    p = p * (r * r) + r;
    i32v bits;
    std::memcpy(&bits, &shifted, sizeof bits);
    const i32v exponent = (bits - 0x4b400000 + 127) << 23;
    f32v scale;
    std::memcpy(&scale, &exponent, sizeof scale);
    return scale * p + (scale - splat(1.0f));
}

inline f32v elu_lanes(f32v x, float alpha) {
    const f32v zero = splat(0.0f);
    const f32v negative = splat(alpha) * expm1_negative(x < zero ? x : zero);
    return x >= zero ? x : (x != x ? x : negative);  // -0 stays -0, as expm1(-0) is
}

}  // namespace

extern "C" {

// ``out[i] = elu(x[i])`` for ``n`` float32 values; ``out`` may be ``x``.
void cadenza_elu_f32(const float* x, float* out, int64_t n, float alpha) {
    const int64_t whole = n / LANES * LANES;
#pragma omp parallel for schedule(static) if (n >= PARALLEL_ELEMENTS)
    for (int64_t i = 0; i < whole; i += LANES) store(out + i, elu_lanes(load(x + i), alpha));
    if (whole < n) {
        float tail[LANES] = {};
        for (int64_t i = whole; i < n; ++i) tail[i - whole] = x[i];
        const f32v result = elu_lanes(load(tail), alpha);
        for (int64_t i = whole; i < n; ++i) out[i] = result[i - whole];
    }
}

// The same for ``n`` bfloat16 values (``uint16_t`` bit patterns).
void cadenza_elu_bf16(const uint16_t* x, uint16_t* out, int64_t n, float alpha) {
    const int64_t whole = n / LANES * LANES;
#pragma omp parallel for schedule(static) if (n >= PARALLEL_ELEMENTS)
    for (int64_t i = 0; i < whole; i += LANES)
        store_bf16(out + i, elu_lanes(load_bf16(x + i), alpha));
    if (whole < n) {
        uint16_t tail[LANES] = {};
        for (int64_t i = whole; i < n; ++i) tail[i - whole] = x[i];
        uint16_t result[LANES];
        store_bf16(result, elu_lanes(load_bf16(tail), alpha));
        for (int64_t i = whole; i < n; ++i) out[i] = result[i - whole];
    }
}

}  // extern "C"
