"""The Triton paged decode kernel (in Triton's interpreter on the CPU) against the torch
reference, over many shapes: GQA ratios, head widths, block sizes, ragged lengths, -1 padded
block tables, forced split counts, fp16/fp32 and int8 pages with scales."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cadenza.kernels import torch_attention
from cadenza.kernels.decode_attention import paged_decode_attention
from cadenza.kernels.kv_quant import dequantize, quantize_per_token
from cadenza.kernels.triton_support import triton_can_run

pytest.importorskip("triton")
pytestmark = pytest.mark.skipif(
    not triton_can_run(torch.device("cpu")), reason="needs TRITON_INTERPRET=1 before import"
)


def _case(
    seed: int,
    lengths: list[int],
    group: int,
    num_kv_heads: int,
    head_dim: int,
    page_size: int,
    dtype: torch.dtype,
    int8: bool,
    spare_blocks: int = 3,
):
    generator = torch.Generator().manual_seed(seed)
    blocks_needed = [math.ceil(n / page_size) for n in lengths]
    num_pages = sum(blocks_needed) + spare_blocks
    max_pages = max(blocks_needed) + 1  # always at least one -1 pad column
    shape = (num_pages, page_size, num_kv_heads, head_dim)
    k_cache = torch.randn(shape, generator=generator).to(dtype)
    v_cache = torch.randn(shape, generator=generator).to(dtype)
    k_scale = v_scale = None
    if int8:
        k_cache, k_scale = quantize_per_token(k_cache)
        v_cache, v_scale = quantize_per_token(v_cache)
    order = torch.randperm(num_pages, generator=generator).tolist()
    tables = torch.full((len(lengths), max_pages), -1, dtype=torch.int32)
    for row, needed in enumerate(blocks_needed):
        tables[row, :needed] = torch.tensor([order.pop() for _ in range(needed)])
    q = torch.randn(len(lengths), group * num_kv_heads, head_dim, generator=generator).to(dtype)
    seq_lens = torch.tensor(lengths, dtype=torch.int32)
    return q, k_cache, v_cache, tables, seq_lens, k_scale, v_scale


def _reference(q, k_cache, v_cache, tables, seq_lens, scale, k_scale, v_scale):
    """Float32 torch reference on dequantized pages."""
    if k_cache.dtype == torch.int8:
        k_cache = dequantize(k_cache, k_scale, torch.float32)
        v_cache = dequantize(v_cache, v_scale, torch.float32)
    return torch_attention.torch_paged_decode_attention(
        q.float(), k_cache.float(), v_cache.float(), tables, seq_lens, scale
    )


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 2**16),
    group=st.sampled_from([1, 2, 4, 8]),
    num_kv_heads=st.sampled_from([1, 2]),
    head_dim=st.sampled_from([64, 128]),
    page_size=st.sampled_from([16, 32]),
    dtype=st.sampled_from([torch.float32, torch.float16]),
    int8=st.booleans(),
    lengths=st.lists(
        st.one_of(st.just(1), st.sampled_from([16, 32, 64]), st.integers(1, 100)),
        min_size=1,
        max_size=4,
    ),
    pages_per_split=st.sampled_from([None, 1, 2]),
)
def test_triton_kernel_matches_the_torch_reference(
    seed, group, num_kv_heads, head_dim, page_size, dtype, int8, lengths, pages_per_split
):
    from cadenza.kernels.triton_decode_attention import triton_paged_decode_attention

    q, k_cache, v_cache, tables, seq_lens, k_scale, v_scale = _case(
        seed, lengths, group, num_kv_heads, head_dim, page_size, dtype, int8
    )
    scale = head_dim**-0.5
    out = triton_paged_decode_attention(
        q, k_cache, v_cache, tables, seq_lens, scale, k_scale, v_scale, pages_per_split
    )
    expected = _reference(q, k_cache, v_cache, tables, seq_lens, scale, k_scale, v_scale)
    assert out.dtype == dtype and out.shape == q.shape
    tolerance = 2e-5 if dtype == torch.float32 else 4e-3
    torch.testing.assert_close(out.float(), expected, atol=tolerance, rtol=tolerance)


def test_public_function_uses_triton_here_and_agrees_with_torch():
    q, k_cache, v_cache, tables, seq_lens, k_scale, v_scale = _case(
        1, [1, 33, 70], 4, 2, 64, 16, torch.float32, True
    )
    out = paged_decode_attention(q, k_cache, v_cache, tables, seq_lens, 0.125, k_scale, v_scale)
    torch_out = torch_attention.torch_paged_decode_attention(
        q, k_cache, v_cache, tables, seq_lens, 0.125, k_scale=k_scale, v_scale=v_scale
    )
    torch.testing.assert_close(out, torch_out, atol=2e-5, rtol=2e-5)


def test_garbage_is_refused_clearly():
    q, k_cache, v_cache, tables, seq_lens, k_scale, v_scale = _case(
        2, [5], 2, 2, 64, 16, torch.float32, True
    )
    with pytest.raises(ValueError, match="k_scale"):
        paged_decode_attention(q, k_cache, v_cache, tables, seq_lens, 0.1)
    with pytest.raises(ValueError, match="group"):
        paged_decode_attention(q[:, :3], k_cache, v_cache, tables, seq_lens, 0.1, k_scale, v_scale)


def test_a_table_wider_than_every_context_splits_each_sequence_s_own_pages():
    """A fixed-shape step's page table is as wide as the longest context the model takes: the
    splits then cut each sequence's own pages (every split works), with the same result."""
    from cadenza.kernels.triton_decode_attention import triton_paged_decode_attention

    q, k_cache, v_cache, tables, seq_lens, _, _ = _case(
        3, [1, 20, 70], 4, 2, 64, 16, torch.float32, False
    )
    wide = torch.full((tables.shape[0], 64), -1, dtype=tables.dtype)
    wide[:, : tables.shape[1]] = tables
    expected = _reference(q, k_cache, v_cache, tables, seq_lens, 0.125, None, None)
    for pages_per_split in (None, 1, 8):
        out = triton_paged_decode_attention(
            q, k_cache, v_cache, wide, seq_lens, 0.125, pages_per_split=pages_per_split
        )
        torch.testing.assert_close(out, expected, atol=2e-5, rtol=2e-5)
