"""Torch reference attention for causal decoding over a KV cache.

Shapes follow the engine's flattened convention: tokens first, then heads, then head width.
Grouped-query attention (fewer KV heads than query heads) is handled by SDPA's ``enable_gqa``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def cached_causal_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, query_start: int, scale: float
) -> torch.Tensor:
    """Attend ``T`` new queries to the ``S`` keys of one sequence, causally.

    ``q``: ``[T, Hq, D]``, the queries at absolute positions ``query_start .. query_start+T-1``.
    ``k``, ``v``: ``[S, Hkv, D]`` with ``S == query_start + T`` (the cache including the new
    tokens). ``Hq`` must be a multiple of ``Hkv``. Returns ``[T, Hq, D]``.

    Query ``i`` sees keys ``0 .. query_start + i``::

        keys     0 ........ query_start ........ S-1
        query 0  ################
        query T-1 ##################################
    """
    num_queries, num_q_heads, _ = q.shape
    num_keys, num_kv_heads, _ = k.shape
    if num_keys != query_start + num_queries:
        raise ValueError(f"cache holds {num_keys} keys, expected {query_start + num_queries}")
    if num_q_heads % num_kv_heads:
        raise ValueError(f"{num_q_heads} query heads do not group over {num_kv_heads} KV heads")
    mask = None
    if num_queries > 1:
        key_pos = torch.arange(num_keys, device=q.device)
        query_pos = torch.arange(query_start, num_keys, device=q.device)
        mask = key_pos[None, :] <= query_pos[:, None]
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1),
        k.transpose(0, 1),
        v.transpose(0, 1),
        attn_mask=mask,
        scale=scale,
        enable_gqa=num_q_heads != num_kv_heads,
    )
    return out.transpose(0, 1)
