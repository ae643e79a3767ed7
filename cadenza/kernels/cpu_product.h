// Products of a few float32 rows with weights packed for them, for cadenza's native CPU
// kernels: ``y[B, N] (+)= x[B, K] @ W^T`` with ``W`` float32 or bfloat16, packed in blocks of 16
// output rows (``packed[n / 16][k][n % 16]``); on a CPU with AVX512-BF16 dot products, bfloat16
// weights are packed as pairs along k (``packed[n / 16][k / 2][n % 16][k % 2]``) and the rows
// are rounded to bfloat16 on the way in, as oneDNN's bf16 products do (``WEIGHT_PAIRS`` says
// which; cadenza/kernels/fused_cpu_decode.py packs either way). Register blocks are sized by
// the machine's vector registers; a product big enough to pay for waking threads is split over
// torch's OpenMP threads by output block.

#pragma once

#include <cstdint>
#include <vector>

#include "cpu_vector.h"

#if defined(__AVX512BF16__)
#include <immintrin.h>
#endif

namespace {

// A product of fewer multiply-adds stays on the calling thread (waking others costs more).
constexpr int64_t PARALLEL_MACS = 1 << 20;
// Weights are packed in blocks of this many output rows whatever the vector width (the
// Python side packs them); a block row is SUB vectors.
constexpr int BLOCK = 16;
constexpr int SUB = BLOCK / LANES;

inline f32v load_weights(const float* p) { return load(p); }

inline f32v load_weights(const uint16_t* p) { return load_bf16(p); }

// Register blocks of the float products: ROWS rows times one block row (SUB vectors), with two
// accumulators each (even and odd k, so that consecutive multiply-adds do not wait on each
// other) where the registers hold them: 8 rows x 2 under AVX-512 (16 of 32 registers); 6 rows x
// 2 vectors x 1 under AVX2 (12 of 16, two for the weights, one for the broadcast input), the
// rows' chains being independent already.
constexpr int PRODUCT_ROWS = VECTOR_REGISTERS >= 32 ? 8 : (VECTOR_REGISTERS - SUB - 1) / SUB;
constexpr int CHAINS = PRODUCT_ROWS * SUB * 2 + 2 * SUB + 1 <= VECTOR_REGISTERS ? 2 : 1;

// y[j, 0:16] (+)= x[j, 0:K] . block[0:K, 0:16] for ROWS rows j: one block of 16 output
// features, the rows' accumulators held in registers.
template <int ROWS, typename Weight>
void product_block(const float* x, int ldx, const Weight* block, int K, float* y, int ldy,
                   bool accumulate) {
    f32v sums[CHAINS][ROWS][SUB];
    for (int c = 0; c < CHAINS; ++c)
        for (int j = 0; j < ROWS; ++j)
            for (int v = 0; v < SUB; ++v) sums[c][j][v] = f32v{};
    int k = 0;
    for (; k + CHAINS <= K; k += CHAINS) {
        for (int c = 0; c < CHAINS; ++c) {
            f32v w[SUB];
            for (int v = 0; v < SUB; ++v)
                w[v] = load_weights(block + (size_t)(k + c) * BLOCK + v * LANES);
            for (int j = 0; j < ROWS; ++j) {
                const float input = x[j * ldx + k + c];
                for (int v = 0; v < SUB; ++v) sums[c][j][v] += input * w[v];
            }
        }
    }
    for (; k < K; ++k) {
        for (int v = 0; v < SUB; ++v) {
            const f32v w = load_weights(block + (size_t)k * BLOCK + v * LANES);
            for (int j = 0; j < ROWS; ++j) sums[0][j][v] += x[j * ldx + k] * w;
        }
    }
    for (int j = 0; j < ROWS; ++j) {
        for (int v = 0; v < SUB; ++v) {
            f32v result = sums[0][j][v];
            for (int c = 1; c < CHAINS; ++c) result += sums[c][j][v];
            float* out = y + j * ldy + v * LANES;
            if (accumulate) result += load(out);
            store(out, result);
        }
    }
}

// y[B, N] (+)= x[B, K] @ W^T with W packed in blocks of 16 output rows; N % 16 == 0.
template <typename Weight>
void product(const float* x, int B, int ldx, const Weight* packed, int N, int K, float* y,
             int ldy, bool accumulate) {
    constexpr int ROWS = PRODUCT_ROWS;
    static_assert(ROWS >= 1 && ROWS <= 8, "the remainder switch below covers up to 7 rows");
    // Output blocks are independent: split over the threads when the product is big enough
    // to pay for waking them (one thread: inline).
#pragma omp parallel for schedule(static) if ((int64_t)B * N * K >= PARALLEL_MACS)
    for (int n = 0; n < N; n += BLOCK) {
        const Weight* block = packed + (size_t)n * K;
        float* out = y + n;
        int b = 0;
        for (; b + ROWS <= B; b += ROWS)
            product_block<ROWS>(x + b * ldx, ldx, block, K, out + b * ldy, ldy, accumulate);
        const float* xr = x + b * ldx;
        float* yr = out + b * ldy;
        switch (B - b) {
            case 7: product_block<7>(xr, ldx, block, K, yr, ldy, accumulate); break;
            case 6: product_block<6>(xr, ldx, block, K, yr, ldy, accumulate); break;
            case 5: product_block<5>(xr, ldx, block, K, yr, ldy, accumulate); break;
            case 4: product_block<4>(xr, ldx, block, K, yr, ldy, accumulate); break;
            case 3: product_block<3>(xr, ldx, block, K, yr, ldy, accumulate); break;
            case 2: product_block<2>(xr, ldx, block, K, yr, ldy, accumulate); break;
            case 1: product_block<1>(xr, ldx, block, K, yr, ldy, accumulate); break;
            default: break;
        }
    }
}

#if defined(__AVX512BF16__)
constexpr bool WEIGHT_PAIRS = true;

// Rows of x (K wide, stride ldx) as bfloat16 pairs: ``pairs[b * K / 2 + i]`` holds k = 2i
// (low half) and 2i + 1; K is even.
void to_pairs(const float* x, int B, int ldx, int K, uint32_t* pairs) {
    for (int b = 0; b < B; ++b) {
        const float* row = x + (size_t)b * ldx;
        uint16_t* out = (uint16_t*)(pairs + (size_t)b * (K / 2));
        int k = 0;
        for (; k + 32 <= K; k += 32) {
            const __m512bh packed =
                _mm512_cvtne2ps_pbh(_mm512_loadu_ps(row + k + 16), _mm512_loadu_ps(row + k));
            _mm512_storeu_si512(out + k, (__m512i)packed);
        }
        for (; k < K; ++k) out[k] = to_bf16(row[k]);
    }
}

// y[j, 0:16] (+)= pairs[j, :] . block for ROWS rows, two bfloat16 products per lane and
// instruction; two accumulators per row (even and odd pairs) for the short chains of few rows.
template <int ROWS>
void pair_product_block(const uint32_t* pairs, int half_k, const uint16_t* block, float* y,
                        int ldy, bool accumulate) {
    __m512 even[ROWS], odd[ROWS];
    for (int j = 0; j < ROWS; ++j) even[j] = odd[j] = _mm512_setzero_ps();
    int i = 0;
    for (; i + 1 < half_k; i += 2) {
        const __m512bh w0 = (__m512bh)_mm512_loadu_si512(block + (size_t)i * 2 * BLOCK);
        const __m512bh w1 = (__m512bh)_mm512_loadu_si512(block + (size_t)(i + 1) * 2 * BLOCK);
        for (int j = 0; j < ROWS; ++j) {
            const uint32_t* row = pairs + (size_t)j * half_k;
            even[j] = _mm512_dpbf16_ps(even[j], (__m512bh)_mm512_set1_epi32((int)row[i]), w0);
            odd[j] = _mm512_dpbf16_ps(odd[j], (__m512bh)_mm512_set1_epi32((int)row[i + 1]), w1);
        }
    }
    if (i < half_k) {
        const __m512bh w0 = (__m512bh)_mm512_loadu_si512(block + (size_t)i * 2 * BLOCK);
        for (int j = 0; j < ROWS; ++j) {
            const uint32_t pair = pairs[(size_t)j * half_k + i];
            even[j] = _mm512_dpbf16_ps(even[j], (__m512bh)_mm512_set1_epi32((int)pair), w0);
        }
    }
    for (int j = 0; j < ROWS; ++j) {
        __m512 result = _mm512_add_ps(even[j], odd[j]);
        if (accumulate) result = _mm512_add_ps(result, _mm512_loadu_ps(y + (size_t)j * ldy));
        _mm512_storeu_ps(y + (size_t)j * ldy, result);
    }
}

// The bfloat16 product with pair-packed weights (see the header).
template <>
void product<uint16_t>(const float* x, int B, int ldx, const uint16_t* packed, int N, int K,
                       float* y, int ldy, bool accumulate) {
    thread_local std::vector<uint32_t> pairs;
    const int half_k = K / 2;
    if (pairs.size() < (size_t)B * half_k) pairs.resize((size_t)B * half_k);
    to_pairs(x, B, ldx, K, pairs.data());
    const uint32_t* all_pairs = pairs.data();
    constexpr int ROWS = 8;
#pragma omp parallel for schedule(static) if ((int64_t)B * N * K >= PARALLEL_MACS)
    for (int n = 0; n < N; n += BLOCK) {
        const uint16_t* block = packed + (size_t)n * K;
        float* out = y + n;
        int b = 0;
        for (; b + ROWS <= B; b += ROWS)
            pair_product_block<ROWS>(all_pairs + (size_t)b * half_k, half_k, block,
                                     out + (size_t)b * ldy, ldy, accumulate);
        const uint32_t* rows = all_pairs + (size_t)b * half_k;
        float* yr = out + (size_t)b * ldy;
        switch (B - b) {
            case 7: pair_product_block<7>(rows, half_k, block, yr, ldy, accumulate); break;
            case 6: pair_product_block<6>(rows, half_k, block, yr, ldy, accumulate); break;
            case 5: pair_product_block<5>(rows, half_k, block, yr, ldy, accumulate); break;
            case 4: pair_product_block<4>(rows, half_k, block, yr, ldy, accumulate); break;
            case 3: pair_product_block<3>(rows, half_k, block, yr, ldy, accumulate); break;
            case 2: pair_product_block<2>(rows, half_k, block, yr, ldy, accumulate); break;
            case 1: pair_product_block<1>(rows, half_k, block, yr, ldy, accumulate); break;
            default: break;
        }
    }
}
#else
constexpr bool WEIGHT_PAIRS = false;
#endif

}  // namespace
