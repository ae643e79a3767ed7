// A linear layer's product on the CPU's AMX tiles: ``y[B, N] = x[B, K] @ W^T`` with W bfloat16,
// pair-packed once (cpu_product.h's layout), x and y float32 (x rounded to bfloat16 on the way
// in, sums in float32). A model's output heads and other products outside the fused decode step
// take it where the tiles are there (cadenza/kernels/cpu_linear.py); the same product the fused
// step and the codec's LSTM run.

#include <cstdint>

#include "cpu_product.h"

extern "C" {

// x: [B, K] float32 (rows contiguous), packed: W [N, K] pair-packed bfloat16, y: [B, N]
// float32. N % 16 == 0, K % 32 == 0. Only where cadenza_tile_products(-1) is 1.
void cadenza_tile_linear_bf16(const float* x, int B, const uint16_t* packed, int N, int K,
                              float* y) {
#if defined(__AVX512BF16__)
    product<uint16_t>(x, B, K, packed, N, K, y, N, false);
#else
    (void)x, (void)B, (void)packed, (void)N, (void)K, (void)y;
#endif
}

}  // extern "C"
