"""The public paged decode attention: Triton whenever Triton can run, torch otherwise.

Triton can run on a CUDA device, and on the CPU when ``TRITON_INTERPRET=1`` was set before
Triton was imported (the interpreter: fp16/fp32 only; how CI checks the kernels). The
engine's CPU backend calls the torch implementation directly (the interpreter is for
checking, not serving).
"""

from __future__ import annotations

import functools
import importlib.util
import os

import torch

from cadenza.kernels import torch_attention


@functools.cache
def triton_installed() -> bool:
    return importlib.util.find_spec("triton") is not None


def triton_can_run(device: torch.device) -> bool:
    """Whether the Triton kernels can run on tensors on ``device``."""
    if not triton_installed():
        return False
    if device.type == "cuda":
        return True
    return device.type == "cpu" and os.environ.get("TRITON_INTERPRET") == "1"


def paged_decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    page_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """One query token per sequence against its KV pages.

    ``q [B, Hq, D]``; ``k_cache, v_cache [num_pages, page_size, Hkv, D]`` (fp32, fp16, bf16
    or int8; ``Hq`` a multiple of ``Hkv``); ``page_tables [B, max_pages]`` int32, -1 padded;
    ``seq_lens [B]`` int32 (keys each query sees, its own included, at least 1); with int8
    caches ``k_scale, v_scale [num_pages, page_size, Hkv]``. Returns ``[B, Hq, D]`` in
    ``q``'s dtype.
    """
    if k_cache.dtype == torch.int8 and (k_scale is None or v_scale is None):
        raise ValueError("an int8 KV cache needs k_scale and v_scale")
    if q.shape[1] % k_cache.shape[2]:
        raise ValueError(f"{q.shape[1]} query heads do not group over {k_cache.shape[2]} KV heads")
    if triton_can_run(q.device) and q.dtype in (torch.float16, torch.float32, torch.bfloat16):
        from cadenza.kernels.triton_decode_attention import triton_paged_decode_attention

        return triton_paged_decode_attention(
            q, k_cache, v_cache, page_tables, seq_lens, scale, k_scale, v_scale
        )
    return torch_attention.torch_paged_decode_attention(
        q, k_cache, v_cache, page_tables, seq_lens, scale, k_scale=k_scale, v_scale=v_scale
    )
