"""The public paged decode attention: one query token per sequence against its KV pages,
through the backend :func:`~cadenza.kernels.attention_backends.attention_backend_for` picks
with Triton's interpreter counted (Triton on CUDA, and on the CPU under ``TRITON_INTERPRET=1``,
how the tests check the kernel; torch otherwise). The model layers call their backend
directly, never the interpreter."""

from __future__ import annotations

import torch

from cadenza.kernels.attention_backends import attention_backend_for


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
    ``q``'s dtype. Raises ``ValueError`` for an int8 cache without scales or query heads that
    do not group over the KV heads.
    """
    if k_cache.dtype == torch.int8 and (k_scale is None or v_scale is None):
        raise ValueError("an int8 KV cache needs k_scale and v_scale")
    if q.shape[1] % k_cache.shape[2]:
        raise ValueError(f"{q.shape[1]} query heads do not group over {k_cache.shape[2]} KV heads")
    backend = attention_backend_for(q.device, q.dtype, interpreter=True)
    return backend.decode(q, k_cache, v_cache, page_tables, seq_lens, scale, k_scale, v_scale)
