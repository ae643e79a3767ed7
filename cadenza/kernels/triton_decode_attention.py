"""Paged decode attention in Triton: one query token per sequence against its KV pages.

Grid ``(batch, kv_heads, splits)``. Each program takes one sequence, one KV head and one
*split* (its share of that sequence's own pages: the pages cut into ``splits`` runs), and
computes the
attention of all the query heads that share the KV head (GQA packing: ``group = Hq / Hkv``
rows, padded to at least 16 for ``tl.dot``) over those pages with an online softmax. It writes
the split's normalised output and its log-sum-exp; a second kernel merges the splits
(``out = Σ_s exp(lse_s − max) o_s / Σ_s exp(lse_s − max)``). Splitting the context keeps the
GPU busy when the batch is small and contexts are long. The runs follow each sequence's
length, not the page table's width: a table as wide as the longest context a model takes (a
fixed-shape step's, :mod:`cadenza.engine.static_decode`) keeps every split busy.

Only pages a sequence really has are read (the loop stops at ``ceil(seq_len / page_size)``),
so a ``-1``-padded page table costs nothing past its end. With int8 caches each token's keys
and values are dequantized on load by their per-token, per-head scales.

Runs on CUDA, where the split kernel's warps and pipeline stages are tuned on the GPU per
head layout (:data:`TUNED_CONFIGS`), and on CPU under ``TRITON_INTERPRET=1`` (fp16/fp32; how
the tests run it).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

MIN_DOT_ROWS = 16  # tl.dot needs at least 16 rows


def _decode_split(
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    k_scale_ptr,
    v_scale_ptr,
    page_tables_ptr,
    seq_lens_ptr,
    out_ptr,
    lse_ptr,
    scale,
    stride_qb,
    stride_qh,
    stride_kb,
    stride_kt,
    stride_kh,
    stride_vb,
    stride_vt,
    stride_vh,
    stride_sb,
    stride_st,
    stride_bt,
    stride_ob,
    stride_oh,
    stride_os,
    stride_lb,
    stride_lh,
    GROUP: tl.constexpr,
    GROUP_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    IS_INT8: tl.constexpr,
    IEEE: tl.constexpr,
):
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    seq_len = tl.load(seq_lens_ptr + seq)
    num_pages = tl.cdiv(seq_len, PAGE_SIZE)
    pages_per_split = tl.cdiv(num_pages, tl.num_programs(2))
    first = split * pages_per_split
    last = tl.minimum(first + pages_per_split, num_pages)

    rows = tl.arange(0, GROUP_PAD)
    dims = tl.arange(0, HEAD_DIM)
    tokens = tl.arange(0, PAGE_SIZE)
    row_ok = rows < GROUP
    q_heads = kv_head * GROUP + rows
    q = tl.load(
        q_ptr + seq * stride_qb + q_heads[:, None] * stride_qh + dims[None, :],
        mask=row_ok[:, None],
        other=0.0,
    )
    compute_dtype = q.dtype

    m_i = tl.full([GROUP_PAD], float("-inf"), tl.float32)
    l_i = tl.zeros([GROUP_PAD], tl.float32)
    acc = tl.zeros([GROUP_PAD, HEAD_DIM], tl.float32)
    for page in range(first, last):
        page_id = tl.load(page_tables_ptr + seq * stride_bt + page).to(tl.int64)
        k_offsets = (
            page_id * stride_kb + tokens[:, None] * stride_kt + kv_head * stride_kh + dims[None, :]
        )
        v_offsets = (
            page_id * stride_vb + tokens[:, None] * stride_vt + kv_head * stride_vh + dims[None, :]
        )
        k = tl.load(k_cache_ptr + k_offsets)
        v = tl.load(v_cache_ptr + v_offsets)
        if IS_INT8:
            scale_offsets = page_id * stride_sb + tokens * stride_st + kv_head
            k_s = tl.load(k_scale_ptr + scale_offsets).to(tl.float32)
            v_s = tl.load(v_scale_ptr + scale_offsets).to(tl.float32)
            k = (k.to(tl.float32) * k_s[:, None]).to(compute_dtype)
            v = (v.to(tl.float32) * v_s[:, None]).to(compute_dtype)
        if IEEE:  # noqa: SIM108 (constexpr branches: the JIT compiles only one)
            scores = tl.dot(q, tl.trans(k), input_precision="ieee")
        else:
            scores = tl.dot(q, tl.trans(k))
        scores = scores * scale
        position = page * PAGE_SIZE + tokens
        scores = tl.where((position < seq_len)[None, :], scores, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(scores, axis=1))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(scores - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        if IEEE:
            acc = acc * alpha[:, None] + tl.dot(p.to(compute_dtype), v, input_precision="ieee")
        else:
            acc = acc * alpha[:, None] + tl.dot(p.to(compute_dtype), v)
        m_i = m_new

    has_keys = l_i > 0
    out = acc / tl.where(has_keys, l_i, 1.0)[:, None]
    lse = tl.where(has_keys, m_i + tl.log(tl.where(has_keys, l_i, 1.0)), float("-inf"))
    tl.store(
        out_ptr
        + seq * stride_ob
        + q_heads[:, None] * stride_oh
        + split * stride_os
        + dims[None, :],
        out,
        mask=row_ok[:, None],
    )
    tl.store(lse_ptr + seq * stride_lb + q_heads * stride_lh + split, lse, mask=row_ok)


# Launch shapes the split kernel is tuned over on a GPU, the first time it meets a head
# layout (Orpheus-3B's: 24 query heads over 8 key heads of 128, pages of 16). Each config
# rewrites only its own outputs, so timing it is harmless; a CUDA graph captures the tuned one
# (the engine's warm-up steps run before its capture).
TUNED_CONFIGS = [
    triton.Config({}, num_warps=warps, num_stages=stages)
    for warps in (2, 4, 8)
    for stages in (1, 2, 3)
]
_decode_split_kernel = triton.jit(_decode_split)
_decode_split_tuned = triton.autotune(
    configs=TUNED_CONFIGS, key=["GROUP", "HEAD_DIM", "PAGE_SIZE", "IS_INT8", "IEEE"]
)(triton.jit(_decode_split))


@triton.jit
def _merge_splits_kernel(
    partial_ptr,
    lse_ptr,
    out_ptr,
    stride_pb,
    stride_ph,
    stride_ps,
    stride_lb,
    stride_lh,
    stride_ob,
    stride_oh,
    num_splits,
    HEAD_DIM: tl.constexpr,
    SPLITS_PAD: tl.constexpr,
):
    seq = tl.program_id(0)
    head = tl.program_id(1)
    splits = tl.arange(0, SPLITS_PAD)
    dims = tl.arange(0, HEAD_DIM)
    split_ok = splits < num_splits
    lse = tl.load(
        lse_ptr + seq * stride_lb + head * stride_lh + splits, mask=split_ok, other=float("-inf")
    )
    top = tl.max(lse, axis=0)
    weights = tl.where(split_ok & (lse > float("-inf")), tl.exp(lse - top), 0.0)
    partial = tl.load(
        partial_ptr
        + seq * stride_pb
        + head * stride_ph
        + splits[:, None] * stride_ps
        + dims[None, :],
        mask=split_ok[:, None],
        other=0.0,
    )
    out = tl.sum(partial * weights[:, None], axis=0) / tl.sum(weights, axis=0)
    tl.store(out_ptr + seq * stride_ob + head * stride_oh + dims, out.to(out_ptr.dtype.element_ty))


def choose_pages_per_split(max_pages: int, batch: int, num_kv_heads: int) -> int:
    """Pages per split: split long contexts until the grid has about 256 programs, never
    below 4 pages per split (each split pays a merge)."""
    programs = max(batch * num_kv_heads, 1)
    splits = max(1, min(max_pages // 4, -(-256 // programs)))
    return max(-(-max_pages // splits), 1)


def triton_paged_decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    page_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
    pages_per_split: int | None = None,
) -> torch.Tensor:
    """See :func:`cadenza.kernels.decode_attention.paged_decode_attention` (same contract)."""
    batch, num_q_heads, head_dim = q.shape
    _, page_size, num_kv_heads, _ = k_cache.shape
    group = num_q_heads // num_kv_heads
    max_pages = page_tables.shape[1]
    out = torch.empty_like(q)
    if batch == 0:
        return out
    per_split = pages_per_split or choose_pages_per_split(max_pages, batch, num_kv_heads)
    num_splits = max(-(-max_pages // per_split), 1)
    partial = torch.empty(
        batch, num_q_heads, num_splits, head_dim, dtype=torch.float32, device=q.device
    )
    lse = torch.empty(batch, num_q_heads, num_splits, dtype=torch.float32, device=q.device)
    is_int8 = k_cache.dtype == torch.int8
    if is_int8:
        assert k_scale is not None and v_scale is not None
        scales_k, scales_v = k_scale, v_scale
    else:
        scales_k = scales_v = seq_lens  # unused placeholders
    page_tables = page_tables.contiguous()
    # Tuned where it runs compiled; the interpreter (the CPU's check) takes Triton's defaults.
    split_kernel = _decode_split_tuned if q.is_cuda else _decode_split_kernel
    split_kernel[(batch, num_kv_heads, num_splits)](
        q,
        k_cache,
        v_cache,
        scales_k,
        scales_v,
        page_tables,
        seq_lens,
        partial,
        lse,
        scale,
        q.stride(0),
        q.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        v_cache.stride(0),
        v_cache.stride(1),
        v_cache.stride(2),
        scales_k.stride(0) if is_int8 else 0,
        scales_k.stride(1) if is_int8 else 0,
        page_tables.stride(0),
        partial.stride(0),
        partial.stride(1),
        partial.stride(2),
        lse.stride(0),
        lse.stride(1),
        GROUP=group,
        GROUP_PAD=max(MIN_DOT_ROWS, triton.next_power_of_2(group)),
        HEAD_DIM=head_dim,
        PAGE_SIZE=page_size,
        IS_INT8=is_int8,
        IEEE=q.dtype == torch.float32,
    )
    _merge_splits_kernel[(batch, num_q_heads)](
        partial,
        lse,
        out,
        partial.stride(0),
        partial.stride(1),
        partial.stride(2),
        lse.stride(0),
        lse.stride(1),
        out.stride(0),
        out.stride(1),
        num_splits,
        HEAD_DIM=head_dim,
        SPLITS_PAD=max(triton.next_power_of_2(num_splits), 2),
    )
    return out
