// Sixteen-lane float32 vectors for cadenza's native CPU kernels: loads and stores, bfloat16
// widening and rounding, lane sums and a vector exponential.
//
// GCC/Clang vector extensions: the compiler maps them to the machine's SIMD (AVX-512, AVX2,
// NEON) under -march=native. Every kernel source includes this header; the library's build
// hash covers it (cadenza/kernels/native_library.py).

#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__AVX512BF16__)
#include <immintrin.h>
#endif

namespace {

typedef float f32x16 __attribute__((vector_size(64)));
typedef int32_t i32x16 __attribute__((vector_size(64)));
typedef uint32_t u32x16 __attribute__((vector_size(64)));
typedef uint16_t u16x16 __attribute__((vector_size(32)));

constexpr int LANES = 16;

inline f32x16 load(const float* p) {
    f32x16 v;
    std::memcpy(&v, p, sizeof v);
    return v;
}

inline void store(float* p, f32x16 v) { std::memcpy(p, &v, sizeof v); }

inline f32x16 splat(float x) { return f32x16{} + x; }

// bfloat16 is the top half of a float32: widening is a shift, exact.
inline f32x16 load_bf16(const uint16_t* p) {
    u16x16 half;
    std::memcpy(&half, p, sizeof half);
    u32x16 bits = __builtin_convertvector(half, u32x16) << 16;
    f32x16 v;
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

// Sixteen lanes of :func:`to_bf16`.
inline void store_bf16(uint16_t* p, f32x16 v) {
#if defined(__AVX512BF16__)
    const __m256bh rounded = _mm512_cvtneps_pbh((__m512)v);  // the same rounding, one op
    std::memcpy(p, &rounded, sizeof rounded);
#else
    u32x16 bits;
    std::memcpy(&bits, &v, sizeof bits);
    const u32x16 rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;
    const u32x16 quiet = (bits >> 16) | 0x40u;
    const u32x16 result = (bits & 0x7fffffffu) > 0x7f800000u ? quiet : rounded;
    const u16x16 half = __builtin_convertvector(result, u16x16);
    std::memcpy(p, &half, sizeof half);
#endif
}

inline float sum_lanes(f32x16 v) {
    float lanes[LANES];
    store(lanes, v);
    float a[8];
    for (int i = 0; i < 8; ++i) a[i] = lanes[i] + lanes[i + 8];
    for (int i = 0; i < 4; ++i) a[i] += a[i + 4];
    return (a[0] + a[2]) + (a[1] + a[3]);
}

// e^x for x <= 0 or moderate x: 2^n * p(r) with r = x - n ln 2 in [-ln2/2, ln2/2] and a
// degree-6 polynomial (Cephes' expf coefficients). Below -87.3 the result is 0; NaN stays NaN.
inline f32x16 exp_lanes(f32x16 x) {
    const f32x16 high = splat(88.37626f), low = splat(-87.33654f);
    const f32x16 input = x;
    x = x > high ? high : x;
    x = x < low ? low : x;
    f32x16 n = x * splat(1.44269504088896341f) + splat(0.5f);
    f32x16 truncated = __builtin_convertvector(__builtin_convertvector(n, i32x16), f32x16);
    n = truncated > n ? truncated - splat(1.0f) : truncated;  // floor
    x = x - n * splat(0.693359375f) - n * splat(-2.12194440e-4f);
    f32x16 y = splat(1.9875691500e-4f);
    y = y * x + splat(1.3981999507e-3f);
    y = y * x + splat(8.3334519073e-3f);
    y = y * x + splat(4.1665795894e-2f);
    y = y * x + splat(1.6666665459e-1f);
    y = y * x + splat(5.0000001201e-1f);
    y = y * (x * x) + x + splat(1.0f);
    i32x16 exponent = (__builtin_convertvector(n, i32x16) + 127) << 23;
    f32x16 scale;
    std::memcpy(&scale, &exponent, sizeof scale);
    y = y * scale;
    y = input < low ? splat(0.0f) : y;
    return input != input ? input : y;  // NaN in, NaN out
}

}  // namespace
