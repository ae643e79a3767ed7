// Products of a few float32 rows with weights packed for them, for cadenza's native CPU
// kernels: ``y[B, N] (+)= x[B, K] @ W^T`` with ``W`` float32 or bfloat16, packed in blocks of 16
// output rows (``packed[n / 16][k][n % 16]``); on a CPU with AVX512-BF16 dot products, bfloat16
// weights are packed as pairs along k (``packed[n / 16][k / 2][n % 16][k % 2]``) and the rows
// are rounded to bfloat16 on the way in, as oneDNN's bf16 products do (``WEIGHT_PAIRS`` says
// which; cadenza/kernels/fused_cpu_decode.py packs either way). Register blocks are sized by
// the machine's vector registers; a product big enough to pay for waking threads is split over
// torch's OpenMP threads by output block.
//
// On a CPU with AMX tiles (Intel Sapphire Rapids and later, built with -march=native there), the
// bfloat16 product runs on the tile unit instead when k is a multiple of 32 and the kernel (Linux)
// grants this process the tile state: the pair-packed block of 16 output rows is, 32 k at a time,
// exactly a B tile (16 rows of k pairs, 64 bytes each), the bf16 rows an A tile of up to 16 rows,
// and the float32 sums a C tile. Same inputs (rounded to bf16), float32 sums in another order:
// 4-7x the dot-product instructions' rate at 8-16 rows, as fast at one (docs/benchmarks.md).

#pragma once

#include <cstdint>
#include <vector>

#include "cpu_vector.h"

#if defined(__AVX512BF16__) || (defined(__AMX_TILE__) && defined(__AMX_BF16__))
#include <immintrin.h>
#endif
#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#define CADENZA_AMX 1
#endif

namespace {

// A product of fewer multiply-adds stays on the calling thread (waking others costs more).
constexpr int64_t PARALLEL_MACS = 1 << 20;
// Weights are packed in blocks of this many output rows whatever the vector width (the
// Python side packs them); a block row is SUB vectors.
constexpr int BLOCK = 16;
constexpr int SUB = BLOCK / LANES;

inline f32v load_weights(const float* p) { return load(p); }

// A layer's weights stream from L3 or memory once per step (a model's layers do not fit the
// L2), a block row of 64 bytes per k (float32) or k pair (bfloat16 pairs): each product asks
// for the row this many rows ahead (4 KB per block). The hardware prefetcher alone lost the
// streams, two at a time in the paired blocks: cadenza-tiny's eight layers at float32, one
// core of a Zen 5, 8 rows 0.70 against 0.91 ms, 16 rows 1.13-1.21 against 1.85; AVX2 build
// 1.14 against 1.78 and 1.79 against 2.47; a 31 M Llama's in bfloat16 pairs, 16 rows 2.4-2.6
// against 4.1-4.4 ms (docs/benchmarks.md). A prefetch past the block's end does no harm:
// prefetches never fault.
constexpr int PREFETCH_AHEAD = 64;

template <typename Weight>
inline void prefetch_weights(const Weight* p) {
    __builtin_prefetch(p);
}

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
            prefetch_weights(block + (size_t)(k + c + PREFETCH_AHEAD) * BLOCK);
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

// Where the registers hold them (AVX-512: 32 vectors of one block row each), full groups of
// PRODUCT_ROWS rows take two output blocks at once: 2 x 8 accumulators, one chain each, every
// broadcast input feeding two multiply-adds, so the loop issues about one load per
// multiply-add pair instead of one per multiply-add, near the multiply-add units' rate (8 or
// 16 rows of the layers of a 31 M Llama and cadenza-tiny, one Zen 5 core, weights in cache:
// 231-248 GFLOP/s against 183-199 one block at a time; the core's FMAs alone 258-265;
// docs/benchmarks.md). A block row of SUB > 1 vectors (AVX2) fills the registers with one
// block already.
constexpr bool PAIRED_BLOCKS = SUB == 1 && 4 * PRODUCT_ROWS + 3 <= 2 * VECTOR_REGISTERS;

// y[j, 0:32] (+)= x[j, 0:K] . (block0 | block1)[0:K, 0:32] for ROWS rows j: two blocks of 16
// output features (SUB == 1), the rows' accumulators held in registers.
template <int ROWS, typename Weight>
void product_block_pair(const float* x, int ldx, const Weight* block0, const Weight* block1,
                        int K, float* y, int ldy, bool accumulate) {
    f32v first[ROWS], second[ROWS];
    for (int j = 0; j < ROWS; ++j) first[j] = second[j] = f32v{};
    for (int k = 0; k < K; ++k) {
        prefetch_weights(block0 + (size_t)(k + PREFETCH_AHEAD) * BLOCK);
        prefetch_weights(block1 + (size_t)(k + PREFETCH_AHEAD) * BLOCK);
        const f32v w0 = load_weights(block0 + (size_t)k * BLOCK);
        const f32v w1 = load_weights(block1 + (size_t)k * BLOCK);
        for (int j = 0; j < ROWS; ++j) {
            const f32v input = splat(x[j * ldx + k]);
            first[j] += input * w0;
            second[j] += input * w1;
        }
    }
    for (int j = 0; j < ROWS; ++j) {
        float* out = y + j * ldy;
        f32v low = first[j], high = second[j];
        if (accumulate) {
            low += load(out);
            high += load(out + LANES);
        }
        store(out, low);
        store(out + LANES, high);
    }
}

// y[0:rows, 0:16] (+)= x . block for the rows (fewer than PRODUCT_ROWS) a product's full
// register blocks leave.
template <typename Weight>
void product_rest(const float* x, int rows, int ldx, const Weight* block, int K, float* y,
                  int ldy, bool accumulate) {
    static_assert(PRODUCT_ROWS <= 8, "the switch below covers up to 7 rows");
    switch (rows) {
        case 7: product_block<7>(x, ldx, block, K, y, ldy, accumulate); break;
        case 6: product_block<6>(x, ldx, block, K, y, ldy, accumulate); break;
        case 5: product_block<5>(x, ldx, block, K, y, ldy, accumulate); break;
        case 4: product_block<4>(x, ldx, block, K, y, ldy, accumulate); break;
        case 3: product_block<3>(x, ldx, block, K, y, ldy, accumulate); break;
        case 2: product_block<2>(x, ldx, block, K, y, ldy, accumulate); break;
        case 1: product_block<1>(x, ldx, block, K, y, ldy, accumulate); break;
        default: break;
    }
}

// y[B, N] (+)= x[B, K] @ W^T with W packed in blocks of 16 output rows; N % 16 == 0.
template <typename Weight>
void product(const float* x, int B, int ldx, const Weight* packed, int N, int K, float* y,
             int ldy, bool accumulate) {
    constexpr int ROWS = PRODUCT_ROWS;
    constexpr int STRIDE = PAIRED_BLOCKS ? 2 * BLOCK : BLOCK;
    const int full = B - B % ROWS;  // rows in full register blocks
    // Output blocks (pairs of them where PAIRED_BLOCKS) are independent: split over the
    // threads when the product is big enough to pay for waking them (one thread: inline).
#pragma omp parallel for schedule(static) if ((int64_t)B * N * K >= PARALLEL_MACS)
    for (int n = 0; n < N; n += STRIDE) {
        const Weight* block = packed + (size_t)n * K;
        const Weight* next = block + (size_t)BLOCK * K;
        const bool pair = PAIRED_BLOCKS && n + BLOCK < N;  // an odd count's last goes alone
        float* out = y + n;
        for (int b = 0; b < full; b += ROWS) {
            if (pair)
                product_block_pair<ROWS>(x + b * ldx, ldx, block, next, K, out + b * ldy, ldy,
                                         accumulate);
            else
                product_block<ROWS>(x + b * ldx, ldx, block, K, out + b * ldy, ldy, accumulate);
        }
        product_rest(x + full * ldx, B - full, ldx, block, K, out + full * ldy, ldy, accumulate);
        if (pair)
            product_rest(x + full * ldx, B - full, ldx, next, K, out + BLOCK + full * ldy, ldy,
                         accumulate);
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
    for (; i + 1 < half_k; i += 2) {  // a block row of k pairs: 64 bytes, a line
        prefetch_weights(block + (size_t)(i + PREFETCH_AHEAD) * 2 * BLOCK);
        prefetch_weights(block + (size_t)(i + 1 + PREFETCH_AHEAD) * 2 * BLOCK);
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

#if defined(CADENZA_AMX)
// Whether the kernel lets this process use the tile registers (Linux asks each process to
// request them: ARCH_REQ_XCOMP_PERM for XTILEDATA; a refusal, as under a hypervisor that does
// not pass AMX through, keeps the dot-product path).
inline bool amx_permitted() {
    static const bool permitted = [] {
        constexpr long REQUEST_PERMISSION = 0x1023, TILE_DATA = 18;
        return syscall(SYS_arch_prctl, REQUEST_PERMISSION, TILE_DATA) == 0;
    }();
    return permitted;
}

// Whether the bfloat16 products use the tiles (where permitted; cadenza_tile_products turns
// them off and on, for side-by-side measurements).
inline bool& tiles_enabled() {
    static bool enabled = amx_permitted();
    return enabled;
}

struct TileConfig {
    uint8_t palette, start_row;
    uint8_t reserved[14];
    uint16_t bytes_per_row[16];
    uint8_t rows[16];
};

// Tiles 0, 1: the sums of row group 0 for two output blocks; 2, 3: those of row group 1; 4, 5:
// the rows of groups 0 and 1; 6, 7: the weights of the two blocks. A group of 0 rows is unused.
inline void configure_tiles(int rows0, int rows1) {
    TileConfig config{};
    config.palette = 1;
    const int rows[8] = {rows0, rows0, rows1, rows1, rows0, rows1, 16, 16};
    for (int t = 0; t < 8; ++t) {
        config.rows[t] = (uint8_t)rows[t];
        config.bytes_per_row[t] = rows[t] ? 64 : 0;
    }
    _tile_loadconfig(&config);
}

// y[0:32, 0:32] (+)= rows . (block0 | block1) for up to two groups of 16 rows (``a``: bf16
// rows of K, contiguous) and one or two blocks of 16 output features.
template <bool TWO_GROUPS, bool TWO_BLOCKS>
inline void tile_blocks(const uint16_t* a, int K, const uint16_t* block0, const uint16_t* block1,
                        float* y, int ldy, bool accumulate) {
    const int stride = ldy * (int)sizeof(float);
    float* y1 = y + (size_t)16 * ldy;
    if (accumulate) {
        _tile_loadd(0, y, stride);
        if (TWO_BLOCKS) _tile_loadd(1, y + 16, stride);
        if (TWO_GROUPS) _tile_loadd(2, y1, stride);
        if (TWO_GROUPS && TWO_BLOCKS) _tile_loadd(3, y1 + 16, stride);
    } else {
        _tile_zero(0);
        if (TWO_BLOCKS) _tile_zero(1);
        if (TWO_GROUPS) _tile_zero(2);
        if (TWO_GROUPS && TWO_BLOCKS) _tile_zero(3);
    }
    const uint16_t* a1 = a + (size_t)16 * K;
    for (int k = 0; k < K; k += 32) {  // 32 k: 16 pairs, a 1 KB block of each weight block
        _tile_loadd(4, a + k, K * 2);
        _tile_loadd(6, block0 + (size_t)k * BLOCK, 64);
        _tile_dpbf16ps(0, 4, 6);
        if (TWO_BLOCKS) {
            _tile_loadd(7, block1 + (size_t)k * BLOCK, 64);
            _tile_dpbf16ps(1, 4, 7);
        }
        if (TWO_GROUPS) {
            _tile_loadd(5, a1 + k, K * 2);
            _tile_dpbf16ps(2, 5, 6);
            if (TWO_BLOCKS) _tile_dpbf16ps(3, 5, 7);
        }
    }
    _tile_stored(0, y, stride);
    if (TWO_BLOCKS) _tile_stored(1, y + 16, stride);
    if (TWO_GROUPS) _tile_stored(2, y1, stride);
    if (TWO_GROUPS && TWO_BLOCKS) _tile_stored(3, y1 + 16, stride);
}

// y[B, N] (+)= a[B, K] @ W^T on the tiles: ``a`` bf16 rows (contiguous), W pair-packed;
// K % 32 == 0. Rows in groups of 32, output blocks in pairs (split over the threads).
void tile_product(const uint16_t* a, int B, int K, const uint16_t* packed, int N, float* y,
                  int ldy, bool accumulate) {
    const int pairs = (N / BLOCK + 1) / 2;
#pragma omp parallel if ((int64_t)B * N * K >= 4 * PARALLEL_MACS)
    {
        for (int b0 = 0; b0 < B; b0 += 32) {
            const int rows0 = B - b0 < 16 ? B - b0 : 16;
            const int rows1 = B - b0 - 16 <= 0 ? 0 : (B - b0 - 16 < 16 ? B - b0 - 16 : 16);
            configure_tiles(rows0, rows1);
            const uint16_t* rows = a + (size_t)b0 * K;
            float* out = y + (size_t)b0 * ldy;
#pragma omp for schedule(static)
            for (int pair = 0; pair < pairs; ++pair) {
                const int n = pair * 2 * BLOCK;
                const uint16_t* block0 = packed + (size_t)n * K;
                const uint16_t* block1 = block0 + (size_t)BLOCK * K;
                const bool two_blocks = n + BLOCK < N;
                if (rows1 && two_blocks)
                    tile_blocks<true, true>(rows, K, block0, block1, out + n, ldy, accumulate);
                else if (rows1)
                    tile_blocks<true, false>(rows, K, block0, block0, out + n, ldy, accumulate);
                else if (two_blocks)
                    tile_blocks<false, true>(rows, K, block0, block1, out + n, ldy, accumulate);
                else
                    tile_blocks<false, false>(rows, K, block0, block0, out + n, ldy, accumulate);
            }
        }
        _tile_release();  // a thread holding no tile state costs nothing to switch out
    }
}
#endif

// The bfloat16 product with pair-packed weights (see the header).
template <>
void product<uint16_t>(const float* x, int B, int ldx, const uint16_t* packed, int N, int K,
                       float* y, int ldy, bool accumulate) {
    thread_local std::vector<uint32_t> pairs;
    const int half_k = K / 2;
    if (pairs.size() < (size_t)B * half_k) pairs.resize((size_t)B * half_k);
    to_pairs(x, B, ldx, K, pairs.data());
    const uint32_t* all_pairs = pairs.data();
#if defined(CADENZA_AMX)
    if (K % 32 == 0 && tiles_enabled()) {
        tile_product((const uint16_t*)all_pairs, B, K, packed, N, y, ldy, accumulate);
        return;
    }
#endif
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

// Each kernel library is one translation unit that includes this header once: this entry point
// is every library's own.
extern "C" {

// 1 when this library's bfloat16 products run on AMX tiles, else 0. ``request`` 1 or 0 turns
// them on (where this CPU and kernel allow) or off first; -1 only asks.
int cadenza_tile_products(int request) {
#if defined(CADENZA_AMX)
    if (request >= 0) tiles_enabled() = request > 0 && amx_permitted();
    return tiles_enabled() ? 1 : 0;
#else
    (void)request;
    return 0;
#endif
}

}  // extern "C"
