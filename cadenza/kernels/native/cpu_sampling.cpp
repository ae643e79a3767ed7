// One draw per row of logits from its top-k (and min-p) candidates, by inverse CDF in id order:
// the CPU form of cadenza/engine/sampler.py's thresholded draw, which on a CPU is a dozen torch
// passes over ``[S, K, V]`` plus a partition (1.3 ms for a 10-stream cadenza-tiny batch) for
// what is, per row, a selection and a prefix sum.
//
// Per row, the same arithmetic as the torch path: ``l = logits / temperature`` (float32),
// ``threshold`` the k-th largest ``l`` (ties at it are all candidates), raised to
// ``max(l) + log(min_p)`` when ``min_p > 0`` and to the lowest float (a masked id, -inf, is
// never a candidate); weights ``exp(l - max)`` for the candidates; the cumulative sum in double
// rounded to float at every id, as torch's CPU ``cumsum`` accumulates; ``target = min(u *
// total, the float below total)``; the id is the first whose cumulative weight exceeds it.
// The k-th largest value is found by bisecting the floats' order with vectorized counts, and
// the sum is taken per vector of ids, then inside the block where the target falls.
// Exponentials are cadenza's vector polynomial (a few ulp from torch's), which moves a draw only
// when the uniform falls in that sliver of the CDF.

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <vector>

#include "cpu_vector.h"

namespace {

typedef float f32half __attribute__((vector_size(2 * LANES)));
typedef double f64v __attribute__((vector_size(4 * LANES)));  // LANES / 2 doubles

// A float's bits as an unsigned key in the floats' order (-inf lowest, +inf highest).
inline u32v order_keys(f32v v) {
    u32v bits;
    std::memcpy(&bits, &v, sizeof bits);
    const u32v negative = (u32v)((i32v)bits >> 31);  // all ones for negative floats
    return bits ^ (negative | 0x80000000u);
}

inline float key_value(uint32_t key) {
    const uint32_t bits = key & 0x80000000u ? key ^ 0x80000000u : ~key;
    float value;
    std::memcpy(&value, &bits, sizeof value);
    return value;
}

// How many of ``keys`` (``vectors`` x LANES, the padding lanes zero) are at least ``bound``.
inline int64_t count_at_least(const u32v* keys, int64_t vectors, uint32_t bound) {
    i32v counts = i32v{};
    for (int64_t i = 0; i < vectors; ++i) counts -= (i32v)(keys[i] >= bound);
    int64_t total = 0;
    for (int j = 0; j < LANES; ++j) total += counts[j];
    return total;
}

// The k-th largest key: the largest bound with at least k keys at or above it, found bit by
// bit from the top (32 vectorized counts, no data-dependent branches per element).
inline uint32_t kth_largest_key(const u32v* keys, int64_t vectors, int64_t k) {
    uint32_t bound = 0;
    for (int bit = 31; bit >= 0; --bit) {
        const uint32_t trial = bound | (1u << bit);
        if (count_at_least(keys, vectors, trial) >= k) bound = trial;
    }
    return bound;
}

}  // namespace

extern "C" {

// ``logits [rows, vocab]`` float32 (rows: sequences x codebooks, sequence-major), ``per_row``
// codebooks per sequence; ``temperature, min_p [sequences]`` float32 (temperature > 0),
// ``top_k [sequences]`` (1 <= top_k <= vocab), ``uniform [rows]`` in [0, 1); ``ids [rows]``.
void cadenza_draw_thresholded(const float* logits, int64_t rows, int64_t vocab, int64_t per_row,
                              const float* temperature, const int64_t* top_k, const float* min_p,
                              const float* uniform, int64_t* ids) {
    const int64_t vectors = (vocab + LANES - 1) / LANES;
    std::vector<float> scaled((size_t)(vectors * LANES));
    std::vector<u32v> keys((size_t)vectors);
    std::vector<float> weights((size_t)(vectors * LANES));
    std::vector<double> block_sums((size_t)vectors);
    for (int64_t r = 0; r < rows; ++r) {
        const int64_t s = r / per_row;
        const float* row = logits + r * vocab;
        const f32v t = splat(temperature[s]);
        f32v best_lanes = splat(-INFINITY);
        for (int64_t i = 0; i < vectors; ++i) {
            f32v v = splat(-INFINITY);
            const int64_t n = vocab - i * LANES < LANES ? vocab - i * LANES : LANES;
            if (n == LANES) {
                v = load(row + i * LANES) / t;
            } else {
                for (int64_t j = 0; j < n; ++j) v[j] = row[i * LANES + j] / temperature[s];
            }
            store(scaled.data() + i * LANES, v);
            best_lanes = v > best_lanes ? v : best_lanes;
            u32v key = order_keys(v);
            if (n < LANES)
                for (int64_t j = n; j < LANES; ++j) key[j] = 0;  // below every real key
            keys[i] = key;
        }
        float best = -INFINITY;
        for (int j = 0; j < LANES; ++j) best = best_lanes[j] > best ? best_lanes[j] : best;
        float threshold = key_value(kth_largest_key(keys.data(), vectors, top_k[s]));
        if (min_p[s] > 0.0f) threshold = std::fmax(threshold, best + std::log(min_p[s]));
        threshold = std::fmax(threshold, -FLT_MAX);
        // Candidates' weights, and each block's sum in double.
        double total_sum = 0.0;
        for (int64_t i = 0; i < vectors; ++i) {
            const f32v v = load(scaled.data() + i * LANES);
            f32v w = exp_lanes(v - splat(best));
            w = v >= splat(threshold) ? w : splat(0.0f);
            store(weights.data() + i * LANES, w);
            f32half low, high;
            std::memcpy(&low, weights.data() + i * LANES, sizeof low);
            std::memcpy(&high, weights.data() + i * LANES + LANES / 2, sizeof high);
            const f64v halves =
                __builtin_convertvector(low, f64v) + __builtin_convertvector(high, f64v);
            double sums[LANES / 2];
            std::memcpy(sums, &halves, sizeof sums);
            for (int width = LANES / 4; width >= 1; width /= 2)
                for (int j = 0; j < width; ++j) sums[j] += sums[j + width];
            const double block = sums[0];
            block_sums[i] = block;
            total_sum += block;
        }
        const float total = (float)total_sum;
        const float target = std::fmin(uniform[r] * total, std::nextafter(total, 0.0f));
        int64_t chosen = vocab - 1;  // only when the row is not a distribution (NaN)
        double running = 0.0;
        for (int64_t i = 0; i < vectors; ++i) {
            if (!((float)(running + block_sums[i]) > target)) {
                running += block_sums[i];
                continue;
            }
            for (int j = 0; j < LANES; ++j) {
                running += (double)weights[i * LANES + j];
                if ((float)running > target) {
                    chosen = i * LANES + j;
                    break;
                }
            }
            break;
        }
        ids[r] = chosen < vocab ? chosen : vocab - 1;
    }
}

}  // extern "C"
