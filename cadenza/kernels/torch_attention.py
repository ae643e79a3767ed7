"""Paged attention in torch: the reference every other backend is checked against, and the
CPU's serving path. KV lives in fixed-size pages addressed by page tables.

Cache layout (one layer): ``k_cache, v_cache [num_pages, page_size, num_kv_heads, head_dim]``.
Token ``t`` of a sequence sits in page ``page_table[t // page_size]`` at offset
``t % page_size``; its *slot* is ``page_id * page_size + offset``.

The functions gather a sequence's pages and hand them to SDPA, with no per-sequence Python
loop for decode.

INT8 caches (``k_cache.dtype == torch.int8``) come with scale tensors ``[num_pages,
page_size, Hkv]`` (one per token and head, :mod:`cadenza.kernels.kv_quant`): stores quantize
on the way in, attention dequantizes what it gathers.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from cadenza.kernels.attention_context import DecodeKeys, decode_keys
from cadenza.kernels.kv_quant import dequantize, quantize_per_token


def store_kv(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
    every_slot_set: bool = False,
) -> None:
    """Write ``k, v [N, Hkv, D]`` into the cache at ``slot_mapping [N]`` (int64; -1 skips),
    quantizing to int8 with per-token, per-head scales when the cache is int8.
    ``every_slot_set``: the caller knows there is no -1 (skips checking)."""
    num_kv_heads, head_dim = k_cache.shape[2], k_cache.shape[3]
    flat_k = k_cache.view(-1, num_kv_heads, head_dim)
    flat_v = v_cache.view(-1, num_kv_heads, head_dim)
    if not every_slot_set and slot_mapping.numel() and bool((slot_mapping < 0).any()):
        keep = slot_mapping >= 0
        k, v, slot_mapping = k[keep], v[keep], slot_mapping[keep]
    if k_cache.dtype == torch.int8:
        if k_scale is None or v_scale is None:
            raise ValueError("an int8 KV cache needs k_scale and v_scale")
        k, k_s = quantize_per_token(k)
        v, v_s = quantize_per_token(v)
        k_scale.view(-1, num_kv_heads).index_copy_(0, slot_mapping, k_s)
        v_scale.view(-1, num_kv_heads).index_copy_(0, slot_mapping, v_s)
    flat_k.index_copy_(0, slot_mapping, k.to(flat_k.dtype))
    flat_v.index_copy_(0, slot_mapping, v.to(flat_v.dtype))


def gather_pages(cache: torch.Tensor, page_table: torch.Tensor, num_tokens: int) -> torch.Tensor:
    """The first ``num_tokens`` tokens of one sequence as ``[num_tokens, Hkv, D]``."""
    page_size = cache.shape[1]
    num_pages = -(-num_tokens // page_size)
    pages = cache[page_table[:num_pages].long()]
    return pages.reshape(num_pages * page_size, *cache.shape[2:])[:num_tokens]


def torch_paged_decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    page_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    keys: DecodeKeys | None = None,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """One query per sequence against that sequence's pages.

    ``q [B, Hq, D]``; ``page_tables [B, max_pages]`` int32, -1 padded; ``seq_lens [B]`` int32,
    the number of cached tokens each query attends to (its own included). Returns ``[B, Hq, D]``.
    ``keys``: the step's :class:`DecodeKeys` when the caller already has them (they are the
    same for every layer of a step).

    Each key head's positions are gathered contiguous (``[B, Hkv, L, D]``) and the ``Hq / Hkv``
    query heads that share it go to SDPA as that head's queries: one small dense attention per
    key head, with no copy of the keys per query head (4x faster than SDPA's GQA path over
    ``[B, L, Hkv, D]`` at 700 positions on the CPU, docs/benchmarks.md).
    """
    batch, num_q_heads, head_dim = q.shape
    page_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    if keys is None:
        keys = decode_keys(page_tables, seq_lens, page_size, num_kv_heads)
    rows = keys.rows.reshape(-1)
    shape = (batch, num_kv_heads, keys.rows.shape[2], head_dim)
    gathered_k = k_cache.view(-1, head_dim).index_select(0, rows).view(shape)
    gathered_v = v_cache.view(-1, head_dim).index_select(0, rows).view(shape)
    if k_cache.dtype == torch.int8:
        assert k_scale is not None and v_scale is not None
        gathered_k = dequantize(gathered_k, k_scale.reshape(-1)[rows].view(shape[:3]), q.dtype)
        gathered_v = dequantize(gathered_v, v_scale.reshape(-1)[rows].view(shape[:3]), q.dtype)
    out = F.scaled_dot_product_attention(
        q.reshape(batch, num_kv_heads, num_q_heads // num_kv_heads, head_dim),
        gathered_k.to(q.dtype),
        gathered_v.to(q.dtype),
        attn_mask=keys.bias.to(q.dtype),
        scale=scale,
    )
    return out.reshape(batch, num_q_heads, head_dim)


def torch_paged_prefill_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    page_table: torch.Tensor,
    context_len: int,
    scale: float,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """``T`` new queries of one sequence, causally, over its first ``context_len`` cached tokens
    (the ``T`` new ones are the last of them). ``q [T, Hq, D]`` -> ``[T, Hq, D]``."""
    keys = gather_pages(k_cache, page_table, context_len)
    values = gather_pages(v_cache, page_table, context_len)
    if k_cache.dtype == torch.int8:
        assert k_scale is not None and v_scale is not None
        keys = dequantize(keys, gather_pages(k_scale, page_table, context_len), q.dtype)
        values = dequantize(values, gather_pages(v_scale, page_table, context_len), q.dtype)
    return cached_causal_attention(
        q, keys.to(q.dtype), values.to(q.dtype), context_len - q.shape[0], scale
    )


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
    if q.device.type == "cuda":
        return batched_causal_attention(q, k, v, query_start, scale)
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


def batched_causal_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, query_start: int, scale: float
) -> torch.Tensor:
    """:func:`cached_causal_attention` in the shapes a GPU's fused SDPA kernels take (what
    CUDA runs; the CPU's own path is the 3-D one above): 4-D ``[1, H, T, D]`` inputs, the key
    heads repeated for their query heads, and the causal rule as ``is_causal`` for a chunk
    with no cached keys before it (the flash kernel) or an additive mask for one that has
    some (the memory-efficient kernel); a boolean mask or 3-D inputs send SDPA to its math
    kernel. Same contract and result."""
    num_queries, num_q_heads, _ = q.shape
    num_keys, num_kv_heads, _ = k.shape
    group = num_q_heads // num_kv_heads
    if group > 1:
        k = k.repeat_interleave(group, dim=1)
        v = v.repeat_interleave(group, dim=1)
    q4, k4, v4 = (x.transpose(0, 1)[None] for x in (q, k, v))
    if query_start == 0:
        out = F.scaled_dot_product_attention(q4, k4, v4, is_causal=True, scale=scale)
    else:
        key_pos = torch.arange(num_keys, device=q.device)
        query_pos = torch.arange(query_start, num_keys, device=q.device)
        bias = torch.zeros(num_queries, num_keys, dtype=q.dtype, device=q.device)
        bias = bias.masked_fill(key_pos[None, :] > query_pos[:, None], float("-inf"))
        out = F.scaled_dot_product_attention(q4, k4, v4, attn_mask=bias[None, None], scale=scale)
    return out[0].transpose(0, 1)
