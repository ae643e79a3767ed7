// The decode step of a Llama decoder stack on the CPU, a few rows at a time, in one call.
//
// A decode step of a small model on the CPU is dominated by the fixed cost of each torch op
// (dispatch, allocation, a pass over tiny tensors), not by its arithmetic: cadenza-tiny's layer
// is ~30 ops that take ~0.5-0.8 ms for one row, while its weights stream from cache in tens of
// microseconds. This file does a whole layer per call with no allocation, the rows of the batch
// in registers: RMSNorm, the fused q/k/v product, rotary positions, the store of the new key
// and value into the paged cache, grouped-query attention over the sequence's pages read in
// place, the output product into the residual, RMSNorm, the fused gate/up product, SiLU times
// up, and the down product into the residual.
//
// Numbers: activations and accumulations are float32; the KV cache float32 or bfloat16 (new
// keys and values rounded to nearest even on the way in, widened exactly on the way out, half
// the bytes attention reads); weights are float32 or bfloat16, packed in blocks of 16 output
// rows, ``packed[n / 16][k][n % 16]`` (cadenza/kernels/fused_cpu_decode.py packs them).
// bfloat16 weights are widened exactly to float32 before each multiply-add, except on a CPU
// with AVX512-BF16 dot products: there the products' inputs are rounded to bfloat16 too (as
// oneDNN's bf16 products do) and multiplied in pairs, twice the multiply-adds per instruction,
// with the weights packed as pairs along k: ``packed[n / 16][k / 2][n % 16][k % 2]``
// (cadenza_weight_pairs() says which). Such a layer's attention over a bfloat16 cache rounds
// its query to bfloat16 as well (see attend).
// Exponentials use a polynomial accurate to float32 rounding (a few ulp).
//
// Portable C++ with GCC/Clang vector extensions in the machine's own vector width (16 floats
// under AVX-512, 8 under AVX2: cpu_vector.h), compiled under the level's -march (native by
// default); register blocks are sized by the machine's register count. The Python side
// compiles this file once per machine and level and calls it through ctypes
// (cadenza/kernels/native/loader.py). Built with OpenMP, big products and the attention of
// many rows are split over the threads torch is set to use (the library shares torch's OpenMP
// runtime: the same threads, the same count).

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "cpu_product.h"
#include "cpu_vector.h"

#if defined(__AVX512BF16__)
#include <immintrin.h>
#endif
#ifdef _OPENMP
#include <omp.h>
#endif

namespace {

constexpr int MAX_HEADS = 128;  // query heads
// Work below these stays on the calling thread (waking others costs more than it saves).
constexpr int64_t PARALLEL_POSITIONS = 2048;  // positions a step's rows attend in all
constexpr int MAX_HEAD_DIM = 128;

// out[b] = weight * x[b] / sqrt(mean(x[b]^2) + eps); H % 16 == 0.
void rms_norm(const float* x, int B, int H, const float* weight, float eps, float* out) {
    for (int b = 0; b < B; ++b) {
        const float* row = x + (size_t)b * H;
        f32v squares = f32v{};
        for (int i = 0; i < H; i += LANES) {
            const f32v v = load(row + i);
            squares += v * v;
        }
        const float inverse = 1.0f / std::sqrt(sum_lanes(squares) / (float)H + eps);
        for (int i = 0; i < H; i += LANES)
            store(out + (size_t)b * H + i, load(weight + i) * (load(row + i) * inverse));
    }
}

// x * cos + [x2, x1] * signed_sin over one head of width D (the "rotate half" convention,
// with the sines of the first half negated by the caller).
void rotate(float* head, const float* cos, const float* signed_sin, int D, float* scratch) {
    const int half = D / 2;
    for (int i = 0; i < D; ++i) {
        const float swapped = i < half ? head[i + half] : head[i - half];
        scratch[i] = head[i] * cos[i] + swapped * signed_sin[i];
    }
    std::memcpy(head, scratch, sizeof(float) * D);
}

struct Shape {
    int32_t hidden, num_heads, num_kv_heads, head_dim, intermediate, page_size;
    float eps, scale;
    int32_t cache_bf16;  // 1: the KV cache holds bfloat16, 0: float32
};

struct LayerWeights {
    const void* qkv;   // [(Hq + 2 Hkv) D] x hidden, packed
    const void* o;     // hidden x [Hq D], packed
    const void* gate_up;  // [2 F] x hidden (gate rows, then up rows), packed
    const void* down;  // hidden x F, packed
    const float* input_norm;
    const float* post_attention_norm;
    void* keys;        // this layer's cache: [slots, Hkv, D], float32 or bfloat16
    void* values;
};

// Lane i of LANES vectors' sums gathered into one vector, by rounds of pairwise shuffles and
// adds (a butterfly) instead of LANES separate reductions. The butterfly leaves the sum of input
// k in lane BIT_REVERSED[k], so callers store the vector meant for lane i at
// ``p[BIT_REVERSED[i]]``.
#if defined(__AVX512F__)
constexpr int BIT_REVERSED[16] = {0, 8, 4, 12, 2, 10, 6, 14, 1, 9, 5, 13, 3, 11, 7, 15};

inline f32v transpose_sum(const f32v* p) {
    f32v halves[8], quarters[4], eighths[2];
    for (int i = 0; i < 8; ++i) {
        const f32v a = p[2 * i], b = p[2 * i + 1];
        halves[i] = __builtin_shufflevector(a, b, 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20,
                                            21, 22, 23) +
                    __builtin_shufflevector(a, b, 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27,
                                            28, 29, 30, 31);
    }
    for (int i = 0; i < 4; ++i) {
        const f32v a = halves[2 * i], b = halves[2 * i + 1];
        quarters[i] = __builtin_shufflevector(a, b, 0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24,
                                              25, 26, 27) +
                      __builtin_shufflevector(a, b, 4, 5, 6, 7, 20, 21, 22, 23, 12, 13, 14, 15,
                                              28, 29, 30, 31);
    }
    for (int i = 0; i < 2; ++i) {
        const f32v a = quarters[2 * i], b = quarters[2 * i + 1];
        eighths[i] = __builtin_shufflevector(a, b, 0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12,
                                             13, 28, 29) +
                     __builtin_shufflevector(a, b, 2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27,
                                             14, 15, 30, 31);
    }
    const f32v a = eighths[0], b = eighths[1];
    return __builtin_shufflevector(a, b, 0, 16, 2, 18, 4, 20, 6, 22, 8, 24, 10, 26, 12, 28, 14,
                                   30) +
           __builtin_shufflevector(a, b, 1, 17, 3, 19, 5, 21, 7, 23, 9, 25, 11, 27, 13, 29, 15,
                                   31);
}
#elif defined(__AVX__)
constexpr int BIT_REVERSED[8] = {0, 4, 2, 6, 1, 5, 3, 7};

inline f32v transpose_sum(const f32v* p) {
    f32v halves[4], quarters[2];
    for (int i = 0; i < 4; ++i) {
        const f32v a = p[2 * i], b = p[2 * i + 1];
        halves[i] = __builtin_shufflevector(a, b, 0, 1, 2, 3, 8, 9, 10, 11) +
                    __builtin_shufflevector(a, b, 4, 5, 6, 7, 12, 13, 14, 15);
    }
    for (int i = 0; i < 2; ++i) {
        const f32v a = halves[2 * i], b = halves[2 * i + 1];
        quarters[i] = __builtin_shufflevector(a, b, 0, 1, 8, 9, 4, 5, 12, 13) +
                      __builtin_shufflevector(a, b, 2, 3, 10, 11, 6, 7, 14, 15);
    }
    const f32v a = quarters[0], b = quarters[1];
    return __builtin_shufflevector(a, b, 0, 8, 2, 10, 4, 12, 6, 14) +
           __builtin_shufflevector(a, b, 1, 9, 3, 11, 5, 13, 7, 15);
}
#else
constexpr int BIT_REVERSED[4] = {0, 2, 1, 3};

inline f32v transpose_sum(const f32v* p) {
    f32v halves[2];
    for (int i = 0; i < 2; ++i) {
        const f32v a = p[2 * i], b = p[2 * i + 1];
        halves[i] = __builtin_shufflevector(a, b, 0, 1, 4, 5) +
                    __builtin_shufflevector(a, b, 2, 3, 6, 7);
    }
    const f32v a = halves[0], b = halves[1];
    return __builtin_shufflevector(a, b, 0, 4, 2, 6) + __builtin_shufflevector(a, b, 1, 5, 3, 7);
}
#endif

// Positions sit in pages scattered over the cache: the hardware prefetcher loses the stream
// at every page boundary, so each row asks for the positions this far ahead (a page of 16
// later), into L2: one core keeps many more L2 misses in flight than L1 ones, and a page's
// lines arrive together instead of one latency after another (B=10 rows of 650 positions,
// cadenza-tiny, 25-35 % faster than 8 positions ahead into L1; docs/benchmarks.md).
constexpr int AHEAD = 16;
constexpr int PREFETCH_INTO_L2 = 2;  // __builtin_prefetch locality: prefetcht1

template <typename Cache>
inline void prefetch_row(const Cache* row, int D) {
    for (int i = 0; i < D; i += 64 / (int)sizeof(Cache))
        __builtin_prefetch(row + i, 0, PREFETCH_INTO_L2);
}

inline f32v load_cache(const float* p) { return load(p); }

inline f32v load_cache(const uint16_t* p) { return load_bf16(p); }

// A new key or value row into the cache: copied, or rounded to bfloat16 (nearest even, as
// torch's conversion does); ``n % LANES == 0``.
inline void store_cache(float* to, const float* from, int n) {
    std::memcpy(to, from, sizeof(float) * n);
}

inline void store_cache(uint16_t* to, const float* from, int n) {
    for (int i = 0; i < n; i += LANES) store_bf16(to + i, load(from + i));
}

// Value rows weighted into HEADS query heads' outputs (``out`` rows of D floats, accumulated
// in registers): ``out[i] += sum_l p_i[l] * value(l)`` for ``l`` in ``[l0, end)``.
template <int HEADS, int D, typename Cache>
inline void weigh_values(const float* const* p, const Cache* values, const int64_t* rows,
                         int value_offset, int row_floats, int l0, int end, int length,
                         bool prefetch, float* out) {
    constexpr int VECTORS = D / LANES;
    f32v sums[HEADS][VECTORS];
    for (int i = 0; i < HEADS; ++i)
        for (int v = 0; v < VECTORS; ++v) sums[i][v] = load(out + i * D + v * LANES);
    for (int l = l0; l < end; ++l) {
        if (prefetch && l + AHEAD < length) prefetch_row(values + rows[l + AHEAD], row_floats);
        const Cache* value = values + rows[l] + value_offset;
        float w[HEADS];
        for (int i = 0; i < HEADS; ++i) w[i] = p[i][l];
        for (int v = 0; v < VECTORS; ++v) {
            const f32v x = load_cache(value + v * LANES);
            for (int i = 0; i < HEADS; ++i) sums[i][v] += w[i] * x;
        }
    }
    for (int i = 0; i < HEADS; ++i)
        for (int v = 0; v < VECTORS; ++v) store(out + i * D + v * LANES, sums[i][v]);
}

// One query row's attention over ``length`` positions, every head: query head ``h`` of
// ``q [Hq, D]`` reads key head ``h / group``. Position ``l``'s keys (all heads, ``Hkv * D``
// floats) start at ``keys + rows[l]``, its values at ``values + rows[l]``. The heads are the
// inner loop, so each position's row is used whole while it is in cache. ``scores`` holds
// ``Hq * padded`` floats (``padded``: ``length`` rounded up to 16); ``out [Hq, D]``.
// With ``ROUND_QUERY`` (the layer's products round their inputs to bfloat16) and a bfloat16
// cache on a CPU with AVX512-BF16 dot products, the query is rounded to bfloat16 too and each
// key row's products are taken in pairs straight from the cache, float32 sums, instead of
// widening every key: the scores then differ from float32's by the query's rounding, as the
// products' outputs do by their inputs' (docs/benchmarks.md measures both).
template <int D, typename Cache, bool ROUND_QUERY>
void attend(const float* q, int Hq, int group, const Cache* keys, const Cache* values,
            const int64_t* rows, int length, float scale, float* scores, float* out) {
    constexpr int VECTORS = D / LANES;
    constexpr int CHUNK = 64;  // positions per pass of the value accumulators
    // Two query heads of one key head per value pass where the registers hold both heads'
    // accumulators (and a value vector and the two weights).
    constexpr bool HEAD_PAIRS = 2 * VECTORS + 2 <= VECTOR_REGISTERS;
    const int padded = (length + BLOCK - 1) / BLOCK * BLOCK;
    const int row_floats = Hq / group * D;
    float inverse[MAX_HEADS];
    f32v maxima[MAX_HEADS];
    for (int h = 0; h < Hq; ++h) maxima[h] = splat(-INFINITY);
    for (int l0 = 0; l0 < padded; l0 += BLOCK) {
        const int count = length - l0 < BLOCK ? length - l0 : BLOCK;
        for (int j = 0; j < count && l0 + j + AHEAD < length; ++j)
            prefetch_row(keys + rows[l0 + j + AHEAD], row_floats);
        const Cache* block_rows[BLOCK];
        for (int j = 0; j < BLOCK; ++j) block_rows[j] = keys + rows[j < count ? l0 + j : l0];
        for (int h = 0; h < Hq; ++h) {
            const int key_offset = h / group * D;
            f32v qv[VECTORS];
            for (int v = 0; v < VECTORS; ++v) qv[v] = load(q + h * D + v * LANES);
#if defined(__AVX512BF16__)
            constexpr bool PAIR_DOTS =
                ROUND_QUERY && std::is_same<Cache, uint16_t>::value && D % 32 == 0;
            __m512bh query_pairs[PAIR_DOTS ? D / 32 : 1];
            if constexpr (PAIR_DOTS)
                for (int v = 0; v < D / 32; ++v)
                    query_pairs[v] =
                        _mm512_cvtne2ps_pbh((__m512)qv[2 * v + 1], (__m512)qv[2 * v]);
#endif
            for (int part = 0; part < BLOCK; part += LANES) {  // LANES positions at a time
                f32v partial[LANES];
                for (int j = 0; j < LANES; ++j) {  // position l0 + part + j; its products
                    const Cache* key = block_rows[part + j] + key_offset;
#if defined(__AVX512BF16__)
                    if constexpr (PAIR_DOTS) {
                        __m512 sums = _mm512_setzero_ps();
                        for (int v = 0; v < D / 32; ++v)
                            sums = _mm512_dpbf16_ps(
                                sums, (__m512bh)_mm512_loadu_si512(key + 32 * v), query_pairs[v]);
                        partial[BIT_REVERSED[j]] = (f32v)sums;
                        continue;
                    }
#endif
                    f32v even = load_cache(key) * qv[0], odd = f32v{};
                    for (int v = 1; v < VECTORS; ++v) {
                        if (v % 2) odd += load_cache(key + v * LANES) * qv[v];
                        else even += load_cache(key + v * LANES) * qv[v];
                    }
                    partial[BIT_REVERSED[j]] = even + odd;
                }
                f32v lanes = transpose_sum(partial) * scale;
                for (int j = 0; j < LANES; ++j)  // past the end: -inf, weight 0 after softmax
                    if (part + j >= count) lanes[j] = -INFINITY;
                store(scores + (size_t)h * padded + l0 + part, lanes);
                maxima[h] = lanes > maxima[h] ? lanes : maxima[h];
            }
        }
    }
    for (int h = 0; h < Hq; ++h) {
        float* row = scores + (size_t)h * padded;
        float top = -INFINITY;
        for (int j = 0; j < LANES; ++j) top = maxima[h][j] > top ? maxima[h][j] : top;
        f32v sums = f32v{};
        for (int l0 = 0; l0 < padded; l0 += LANES) {
            const f32v e = exp_lanes(load(row + l0) - splat(top));
            store(row + l0, e);
            sums += e;
        }
        inverse[h] = 1.0f / sum_lanes(sums);
    }
    std::memset(out, 0, sizeof(float) * Hq * D);
    for (int l0 = 0; l0 < length; l0 += CHUNK) {
        const int end = l0 + CHUNK < length ? l0 + CHUNK : length;
        for (int h = 0; h < Hq;) {
            const int value_offset = h / group * D;
            const float* p[2] = {scores + (size_t)h * padded, scores + (size_t)(h + 1) * padded};
            if (HEAD_PAIRS && h + 1 < Hq && (h + 1) / group == h / group) {
                weigh_values<2, D>(p, values, rows, value_offset, row_floats, l0, end, length,
                                   h == 0, out + h * D);
                h += 2;
            } else {
                weigh_values<1, D>(p, values, rows, value_offset, row_floats, l0, end, length,
                                   h == 0, out + h * D);
                h += 1;
            }
        }
    }
    for (int h = 0; h < Hq; ++h)
        for (int v = 0; v < VECTORS; ++v)
            store(out + h * D + v * LANES, load(out + h * D + v * LANES) * inverse[h]);
}

template <typename Cache, bool ROUND_QUERY>
void attend_any(const float* q, int Hq, int group, int D, const Cache* keys, const Cache* values,
                const int64_t* rows, int length, float scale, float* scores, float* out) {
#define CADENZA_ATTEND(WIDTH)                                                                  \
    attend<WIDTH, Cache, ROUND_QUERY>(q, Hq, group, keys, values, rows, length, scale, scores, \
                                      out)
    switch (D / BLOCK) {
        case 1: CADENZA_ATTEND(16); break;
        case 2: CADENZA_ATTEND(32); break;
        case 3: CADENZA_ATTEND(48); break;
        case 4: CADENZA_ATTEND(64); break;
        case 5: CADENZA_ATTEND(80); break;
        case 6: CADENZA_ATTEND(96); break;
        case 7: CADENZA_ATTEND(112); break;
        case 8: CADENZA_ATTEND(128); break;
        default: break;  // head widths over 128 stay on torch (fused_cpu_decode.py)
    }
#undef CADENZA_ATTEND
}

// Everything a step's layers share: the rows' cache offsets, and the work space.
struct Step {
    int B;
    int longest;          // the most positions any row attends to
    const int64_t* rows;  // [B, longest]: element offset of position l's key row in a layer
    float* work;          // work_floats(...) floats
};

template <typename Weight, typename Cache>
void decode_layer(const Shape& s, const LayerWeights& w, const Step& step, float* x,
                  const float* cos, const float* signed_sin, const int64_t* slots,
                  const int32_t* seq_lens) {
    const int B = step.B, H = s.hidden, D = s.head_dim, Hq = s.num_heads, Hkv = s.num_kv_heads;
    const int F = s.intermediate, width = (Hq + 2 * Hkv) * D, group = Hq / Hkv;
    constexpr bool ROUND_QUERY = std::is_same<Weight, uint16_t>::value && WEIGHT_PAIRS;
    float* normed = step.work;                        // [B, H]
    float* qkv = normed + (size_t)B * H;              // [B, width]
    float* attention = qkv + (size_t)B * width;       // [B, Hq D]
    float* gate_up = attention + (size_t)B * Hq * D;  // [B, 2F]
    float* scores = gate_up + (size_t)B * 2 * F;      // [Hq, longest rounded up to 16]
    float rotated[MAX_HEAD_DIM];

    rms_norm(x, B, H, w.input_norm, s.eps, normed);
    product<Weight>(normed, B, H, (const Weight*)w.qkv, width, H, qkv, width, false);
    const int stride = Hkv * D;
    for (int b = 0; b < B; ++b) {
        float* row = qkv + (size_t)b * width;
        for (int head = 0; head < Hq + Hkv; ++head)
            rotate(row + head * D, cos + (size_t)b * D, signed_sin + (size_t)b * D, D, rotated);
        if (slots[b] >= 0) {
            store_cache((Cache*)w.keys + slots[b] * stride, row + Hq * D, stride);
            store_cache((Cache*)w.values + slots[b] * stride, row + (Hq + Hkv) * D, stride);
        }
    }
    int64_t attended = 0;
    for (int b = 0; b < B; ++b) attended += seq_lens[b];
    // Rows attend independently, each thread with scores of its own.
#pragma omp parallel if (attended >= PARALLEL_POSITIONS && B > 1)
    {
        thread_local std::vector<float> own;
        float* row_scores = scores;
#ifdef _OPENMP
        if (omp_get_num_threads() > 1) {
            own.resize((size_t)Hq * ((step.longest + BLOCK - 1) / BLOCK * BLOCK));
            row_scores = own.data();
        }
#endif
#pragma omp for schedule(dynamic, 1)
        for (int b = 0; b < B; ++b)
            attend_any<Cache, ROUND_QUERY>(
                qkv + (size_t)b * width, Hq, group, D, (const Cache*)w.keys, (const Cache*)w.values,
                step.rows + (size_t)b * step.longest, seq_lens[b], s.scale, row_scores,
                attention + (size_t)b * Hq * D);
    }
    product<Weight>(attention, B, Hq * D, (const Weight*)w.o, H, Hq * D, x, H, true);
    rms_norm(x, B, H, w.post_attention_norm, s.eps, normed);
    product<Weight>(normed, B, H, (const Weight*)w.gate_up, 2 * F, H, gate_up, 2 * F, false);
    for (int b = 0; b < B; ++b) {
        float* row = gate_up + (size_t)b * 2 * F;
        for (int i = 0; i < F; i += LANES) {
            const f32v gate = load(row + i);
            store(row + i, gate / (splat(1.0f) + exp_lanes(-gate)) * load(row + F + i));
        }
    }
    product<Weight>(gate_up, B, 2 * F, (const Weight*)w.down, H, F, x, H, true);
}

int64_t work_floats(const Shape& s, int B, int longest) {
    const int64_t width = (int64_t)(s.num_heads + 2 * s.num_kv_heads) * s.head_dim;
    const int64_t padded = (longest + BLOCK - 1) / BLOCK * BLOCK;
    return (int64_t)B * (s.hidden + width + (int64_t)s.num_heads * s.head_dim +
                         2 * (int64_t)s.intermediate) +
           (int64_t)s.num_heads * padded;
}

template <typename Weight>
void decode_layers(const Shape& s, const LayerWeights* layers, int num_layers, int B, float* x,
                   const float* cos, const float* signed_sin, const int64_t* slots,
                   const int32_t* page_tables, int max_pages, const int32_t* seq_lens,
                   void* scratch) {
    int longest = 1;
    for (int b = 0; b < B; ++b) longest = seq_lens[b] > longest ? seq_lens[b] : longest;
    int64_t* rows = (int64_t*)scratch;
    const int64_t stride = (int64_t)s.num_kv_heads * s.head_dim;
    for (int b = 0; b < B; ++b) {
        const int32_t* table = page_tables + (size_t)b * max_pages;
        int64_t* out = rows + (size_t)b * longest;
        for (int l = 0, page = 0; l < seq_lens[b]; ++page) {
            const int64_t first = (int64_t)table[page] * s.page_size;
            for (int offset = 0; offset < s.page_size && l < seq_lens[b]; ++offset, ++l)
                out[l] = (first + offset) * stride;
        }
    }
    const Step step{B, longest, rows, (float*)(rows + (size_t)B * longest)};
    for (int i = 0; i < num_layers; ++i) {
        if (s.cache_bf16)
            decode_layer<Weight, uint16_t>(s, layers[i], step, x, cos, signed_sin, slots,
                                           seq_lens);
        else
            decode_layer<Weight, float>(s, layers[i], step, x, cos, signed_sin, slots, seq_lens);
    }
}

}  // namespace

extern "C" {

// ``x [B, hidden]`` (the residual stream, updated in place) through ``num_layers`` layers.
// ``cos, signed_sin [B, head_dim]``; ``slots [B]``, where each row's new key and value go (-1:
// nowhere); ``page_tables [B, max_pages]``; ``seq_lens [B]``, the positions each row attends to
// (its own included, at least 1). ``scratch``: ``cadenza_decode_scratch_bytes`` bytes, 8-aligned.
void cadenza_decode_layers_f32(const Shape* s, const LayerWeights* layers, int num_layers, int B,
                               float* x, const float* cos, const float* signed_sin,
                               const int64_t* slots, const int32_t* page_tables, int max_pages,
                               const int32_t* seq_lens, void* scratch) {
    decode_layers<float>(*s, layers, num_layers, B, x, cos, signed_sin, slots, page_tables,
                         max_pages, seq_lens, scratch);
}

void cadenza_decode_layers_bf16(const Shape* s, const LayerWeights* layers, int num_layers,
                                int B, float* x, const float* cos, const float* signed_sin,
                                const int64_t* slots, const int32_t* page_tables, int max_pages,
                                const int32_t* seq_lens, void* scratch) {
    decode_layers<uint16_t>(*s, layers, num_layers, B, x, cos, signed_sin, slots, page_tables,
                            max_pages, seq_lens, scratch);
}

// 1 when bfloat16 weights are multiplied in pairs (pack them ``[n / 16][k / 2][n % 16][k %
// 2]``), 0 when widened one by one (``[n / 16][k][n % 16]``).
int cadenza_weight_pairs() { return WEIGHT_PAIRS ? 1 : 0; }

int64_t cadenza_decode_scratch_bytes(const Shape* s, int B, int longest) {
    if (longest < 1) longest = 1;
    return (int64_t)B * longest * (int64_t)sizeof(int64_t) +
           work_floats(*s, B, longest) * (int64_t)sizeof(float);
}

}  // extern "C"
