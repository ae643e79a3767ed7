// A linear layer's bfloat16 product on the CPU: ``y[B, N] = x[B, K] @ W^T`` with W bfloat16,
// pair-packed once (cpu_product.h's layout), x and y float32 (x rounded to bfloat16 on the way
// in, sums in float32). On AMX tiles where the CPU has them and the kernel grants them, else on
// AVX512-BF16 dot products: the product the fused decode step and the codec's LSTM run. A
// model's output heads and other products outside the fused step take it
// (cadenza/kernels/cpu_linear.py).

#include <cstdint>

#include "cpu_product.h"

extern "C" {

// x: [B, K] float32 (rows contiguous), packed: W [N, K] pair-packed bfloat16, y: [B, N]
// float32. N % 16 == 0, K % 32 == 0. Only where cadenza_bf16_linear_native() is 1.
void cadenza_bf16_linear(const float* x, int B, const uint16_t* packed, int N, int K, float* y) {
#if defined(__AVX512BF16__)
    product<uint16_t>(x, B, K, packed, N, K, y, N, false);
#else
    (void)x, (void)B, (void)packed, (void)N, (void)K, (void)y;
#endif
}

// 1 where this build multiplies bfloat16 natively (AVX512-BF16, and AMX tiles where granted:
// cadenza_tile_products), 0 where cadenza_bf16_linear does nothing.
int cadenza_bf16_linear_native() { return WEIGHT_PAIRS ? 1 : 0; }

}  // extern "C"
