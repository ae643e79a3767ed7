"""Weight-only INT8 matrix product in Triton (W8A16): ``y = x @ (q * scale).T``.

``x [M, K]`` in fp16/bf16 (fp32 in the interpreter), ``q [N, K]`` int8 weights with one scale
per output channel ``scale [N]``. Each program computes a ``BLOCK_M x BLOCK_N`` tile of ``y``,
loading int8 weight tiles (half the bytes of fp16) and converting them to the activation dtype
in registers; the scale multiplies the accumulated tile once at the end, since it is constant
along ``K``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _w8a16_kernel(
    x_ptr,
    w_ptr,
    scale_ptr,
    y_ptr,
    M,
    N,
    K,
    stride_xm,
    stride_wn,
    stride_ym,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    IEEE: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    depth = tl.arange(0, BLOCK_K)
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k0 in range(0, K, BLOCK_K):
        ks = k0 + depth
        x = tl.load(
            x_ptr + rows[:, None] * stride_xm + ks[None, :],
            mask=(rows[:, None] < M) & (ks[None, :] < K),
            other=0.0,
        )
        w = tl.load(
            w_ptr + cols[None, :] * stride_wn + ks[:, None],
            mask=(cols[None, :] < N) & (ks[:, None] < K),
            other=0,
        )
        if IEEE:
            acc += tl.dot(x, w.to(x.dtype), input_precision="ieee")
        else:
            acc += tl.dot(x, w.to(x.dtype))
    scale = tl.load(scale_ptr + cols, mask=cols < N, other=0.0)
    y = acc * scale[None, :]
    tl.store(
        y_ptr + rows[:, None] * stride_ym + cols[None, :],
        y.to(y_ptr.dtype.element_ty),
        mask=(rows[:, None] < M) & (cols[None, :] < N),
    )


def triton_w8a16_matmul(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``x [..., K]`` @ dequantized ``weight [N, K]`` int8 -> ``[..., N]`` in ``x``'s dtype."""
    flat = x.reshape(-1, x.shape[-1]).contiguous()
    m, k = flat.shape
    n = weight.shape[0]
    y = torch.empty(m, n, dtype=x.dtype, device=x.device)
    block_m = 16 if m <= 16 else 64
    grid = (triton.cdiv(m, block_m), triton.cdiv(n, 64))
    _w8a16_kernel[grid](
        flat,
        weight,
        scale,
        y,
        m,
        n,
        k,
        flat.stride(0),
        weight.stride(0),
        y.stride(0),
        BLOCK_M=block_m,
        BLOCK_N=64,
        BLOCK_K=64,
        IEEE=x.dtype == torch.float32,
    )
    return y.reshape(*x.shape[:-1], n)
