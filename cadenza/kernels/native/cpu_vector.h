// float32 vectors of the machine's width for cadenza's native CPU kernels: loads and stores,
// bfloat16 widening and rounding, lane sums and a vector exponential.
//
// GCC/Clang vector extensions: the compiler maps them to the SIMD of the level's -march
// (AVX-512, AVX2, NEON; -march=native by default: cadenza/kernels/native/isa.py). Every kernel
// source includes this header; the library's build hash covers it
// (cadenza/kernels/native/loader.py).

#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__AVX512BF16__)
#include <immintrin.h>
#endif

namespace {

// The machine's own vector width: 16 floats under AVX-512, 8 under AVX2, 4 otherwise (SSE,
// NEON). GCC keeps a generic vector wider than the hardware's in memory (every operation a
// store and a reload), so kernels work in vectors of exactly this width and size their register
// blocks by VECTOR_REGISTERS, how many such vectors the register file holds.
#if defined(__AVX512F__)
constexpr int LANES = 16;
constexpr int VECTOR_REGISTERS = 32;
#elif defined(__AVX__)
constexpr int LANES = 8;
constexpr int VECTOR_REGISTERS = 16;
#else
constexpr int LANES = 4;
constexpr int VECTOR_REGISTERS = 16;  // SSE's 16 (NEON has 32; 16 is the safe count)
#endif

typedef float f32v __attribute__((vector_size(4 * LANES)));
typedef int32_t i32v __attribute__((vector_size(4 * LANES)));
typedef uint32_t u32v __attribute__((vector_size(4 * LANES)));
typedef uint16_t u16v __attribute__((vector_size(2 * LANES)));

inline f32v load(const float* p) {
    f32v v;
    std::memcpy(&v, p, sizeof v);
    return v;
}

inline void store(float* p, f32v v) { std::memcpy(p, &v, sizeof v); }

inline f32v splat(float x) { return f32v{} + x; }

// bfloat16 is the top half of a float32: widening is a shift, exact.
inline f32v load_bf16(const uint16_t* p) {
    u16v half;
    std::memcpy(&half, p, sizeof half);
    u32v bits = __builtin_convertvector(half, u32v) << 16;
    f32v v;
    std::memcpy(&v, &bits, sizeof v);
    return v;
}

// float32 to bfloat16, rounding to nearest even; NaN stays NaN (quiet).
inline uint16_t to_bf16(float value) {
    uint32_t bits;
    std::memcpy(&bits, &value, sizeof bits);
    if ((bits & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((bits >> 16) | 0x40u);
    return (uint16_t)((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}

// A vector's lanes of :func:`to_bf16`.
inline void store_bf16(uint16_t* p, f32v v) {
#if defined(__AVX512BF16__)
    const __m256bh rounded = _mm512_cvtneps_pbh((__m512)v);  // the same rounding, one op
    std::memcpy(p, &rounded, sizeof rounded);
#else
    u32v bits;
    std::memcpy(&bits, &v, sizeof bits);
    const u32v rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;
    const u32v quiet = (bits >> 16) | 0x40u;
    const u32v result = (bits & 0x7fffffffu) > 0x7f800000u ? quiet : rounded;
    const u16v half = __builtin_convertvector(result, u16v);
    std::memcpy(p, &half, sizeof half);
#endif
}

// The sum of a vector's lanes (pairwise: halves added until one lane is left).
inline float sum_lanes(f32v v) {
    float lanes[LANES];
    store(lanes, v);
    for (int width = LANES / 2; width >= 1; width /= 2)
        for (int i = 0; i < width; ++i) lanes[i] += lanes[i + width];
    return lanes[0];
}

// e^x for x <= 0 or moderate x: 2^n * p(r) with r = x - n ln 2 in [-ln2/2, ln2/2] and a
// degree-6 polynomial (Cephes' expf coefficients). Below -87.3 the result is 0; NaN stays NaN.
inline f32v exp_lanes(f32v x) {
    const f32v high = splat(88.37626f), low = splat(-87.33654f);
    const f32v input = x;
    x = x > high ? high : x;
    x = x < low ? low : x;
    f32v n = x * splat(1.44269504088896341f) + splat(0.5f);
    f32v truncated = __builtin_convertvector(__builtin_convertvector(n, i32v), f32v);
    n = truncated > n ? truncated - splat(1.0f) : truncated;  // floor
    x = x - n * splat(0.693359375f) - n * splat(-2.12194440e-4f);
    f32v y = splat(1.9875691500e-4f);
    y = y * x + splat(1.3981999507e-3f);
    y = y * x + splat(8.3334519073e-3f);
    y = y * x + splat(4.1665795894e-2f);
    y = y * x + splat(1.6666665459e-1f);
    y = y * x + splat(5.0000001201e-1f);
    y = y * (x * x) + x + splat(1.0f);
    i32v exponent = (__builtin_convertvector(n, i32v) + 127) << 23;
    f32v scale;
    std::memcpy(&scale, &exponent, sizeof scale);
    y = y * scale;
    y = input < low ? splat(0.0f) : y;
    return input != input ? input : y;  // NaN in, NaN out
}

}  // namespace
