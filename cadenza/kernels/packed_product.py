"""The weight layout of the native CPU products (``cpu_product.h``): what every native kernel
that multiplies a few rows by a weight matrix (the fused decode step, the codec's LSTM) packs
its weights into once, at load."""

from __future__ import annotations

import torch

BLOCK = 16  # output rows per packed block, whatever the machine's vector width


def pack_weight(weight: torch.Tensor, dtype: torch.dtype, pairs: bool = False) -> torch.Tensor:
    """``weight [N, K]`` (``N % 16 == 0``) in the kernel's layout, in ``dtype``: blocks of 16
    output rows, ``packed[n // 16, k, n % 16] = weight[n, k]``; with ``pairs`` (bfloat16
    multiplied in pairs, ``K`` even) ``packed[n // 16, k // 2, n % 16, k % 2]``."""
    out_features, in_features = weight.shape
    blocks = weight.detach().to(dtype).reshape(out_features // BLOCK, BLOCK, in_features)
    if pairs:
        halves = blocks.reshape(out_features // BLOCK, BLOCK, in_features // 2, 2)
        return halves.permute(0, 2, 1, 3).contiguous()
    return blocks.transpose(1, 2).contiguous()
