"""The torch paged decode attention (the CPU's serving path) against attention written out by
hand per sequence in float64: GQA groups, ragged lengths, -1 padded page tables, int8 pages."""

from __future__ import annotations

import math

import pytest
import torch

from cadenza.kernels import torch_attention
from cadenza.kernels.attention_context import AttentionContext, decode_keys
from cadenza.kernels.kv_quant import dequantize, quantize_per_token


def _by_hand(q, k_cache, v_cache, tables, lengths, scale):
    """``softmax(q k^T * scale) v`` per sequence and query head, in float64."""
    page_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    group = q.shape[1] // num_kv_heads
    out = torch.empty(q.shape, dtype=torch.float64)
    for b, length in enumerate(lengths):
        slots = [int(tables[b, t // page_size]) * page_size + t % page_size for t in range(length)]
        keys = k_cache.reshape(-1, num_kv_heads, k_cache.shape[3])[slots].double()
        values = v_cache.reshape(-1, num_kv_heads, v_cache.shape[3])[slots].double()
        for head in range(q.shape[1]):
            kv_head = head // group
            weights = (keys[:, kv_head] @ q[b, head].double() * scale).softmax(0)
            out[b, head] = weights @ values[:, kv_head]
    return out


def _case(seed: int, lengths: list[int], group: int, num_kv_heads: int, page_size: int = 16):
    generator = torch.Generator().manual_seed(seed)
    needed = [math.ceil(n / page_size) for n in lengths]
    num_pages = sum(needed) + 2
    shape = (num_pages, page_size, num_kv_heads, 64)
    k_cache = torch.randn(shape, generator=generator)
    v_cache = torch.randn(shape, generator=generator)
    order = torch.randperm(num_pages, generator=generator).tolist()
    tables = torch.full((len(lengths), max(needed) + 1), -1, dtype=torch.int32)
    for row, count in enumerate(needed):
        tables[row, :count] = torch.tensor([order.pop() for _ in range(count)])
    q = torch.randn(len(lengths), group * num_kv_heads, 64, generator=generator)
    return q, k_cache, v_cache, tables, torch.tensor(lengths, dtype=torch.int32)


@pytest.mark.parametrize("group", [1, 2, 4])
@pytest.mark.parametrize("num_kv_heads", [1, 2])
@pytest.mark.parametrize("lengths", [[1], [1, 17, 40], [33, 5, 64, 2]])
def test_decode_attention_equals_attention_by_hand(group, num_kv_heads, lengths):
    q, k_cache, v_cache, tables, seq_lens = _case(
        len(lengths) + group, lengths, group, num_kv_heads
    )
    out = torch_attention.torch_paged_decode_attention(q, k_cache, v_cache, tables, seq_lens, 0.125)
    expected = _by_hand(q, k_cache, v_cache, tables, lengths, 0.125)
    assert out.shape == q.shape and out.dtype == torch.float32
    torch.testing.assert_close(out.double(), expected, atol=2e-6, rtol=2e-6)
    keys = decode_keys(tables, seq_lens, k_cache.shape[1], num_kv_heads)
    given = torch_attention.torch_paged_decode_attention(
        q, k_cache, v_cache, tables, seq_lens, 0.125, keys=keys
    )
    assert torch.equal(given, out)  # the step's precomputed keys change nothing
    # The longest length given by a caller who knows it on the host: the same keys, no read.
    known = decode_keys(tables, seq_lens, k_cache.shape[1], num_kv_heads, max_len=max(lengths))
    for field in ("slots", "mask", "rows", "bias"):
        assert torch.equal(getattr(known, field), getattr(keys, field))


def test_a_context_says_whether_every_token_has_a_slot_from_its_builder_or_its_slots():
    empty = torch.zeros((0, 1), dtype=torch.int32)
    lens = torch.zeros(0, dtype=torch.int32)

    def context(slots, every=None):
        return AttentionContext(torch.tensor(slots), 0, empty, lens, (), every_slot_set=every)

    assert context([3, 4]).stores_every_token and not context([3, -1]).stores_every_token
    assert context([], None).stores_every_token
    assert context([3, -1], True).stores_every_token  # the builder's word, read nowhere


def test_int8_pages_decode_to_the_attention_of_their_dequantized_values():
    lengths = [3, 29, 50]
    q, k_cache, v_cache, tables, seq_lens = _case(7, lengths, 2, 2)
    k_int8, k_scale = quantize_per_token(k_cache)
    v_int8, v_scale = quantize_per_token(v_cache)
    out = torch_attention.torch_paged_decode_attention(
        q, k_int8, v_int8, tables, seq_lens, 0.125, k_scale=k_scale, v_scale=v_scale
    )
    expected = _by_hand(
        q,
        dequantize(k_int8, k_scale, torch.float32),
        dequantize(v_int8, v_scale, torch.float32),
        tables,
        lengths,
        0.125,
    )
    torch.testing.assert_close(out.double(), expected, atol=2e-6, rtol=2e-6)


@pytest.mark.parametrize(("query_start", "num_queries"), [(0, 1), (0, 7), (5, 1), (9, 6)])
@pytest.mark.parametrize("group", [1, 3])
def test_the_gpu_shaped_prefill_attends_as_the_cpu_s(query_start, num_queries, group) -> None:
    """CUDA's 4-D prefill (``is_causal`` for a fresh chunk, an additive mask after cached
    keys, key heads repeated) against the 3-D path the CPU serves with, and by hand."""
    generator = torch.Generator().manual_seed(query_start * 10 + num_queries + group)
    keys = query_start + num_queries
    q = torch.randn(num_queries, 2 * group, 16, generator=generator)
    k = torch.randn(keys, 2, 16, generator=generator)
    v = torch.randn(keys, 2, 16, generator=generator)
    got = torch_attention.batched_causal_attention(q, k, v, query_start, 0.25)
    cpu = torch_attention.cached_causal_attention(q, k, v, query_start, 0.25)
    torch.testing.assert_close(got, cpu, atol=1e-5, rtol=1e-5)
    for i in range(num_queries):  # query i sees keys 0 .. query_start + i
        seen = query_start + i + 1
        for head in range(2 * group):
            weights = (k[:seen, head // group] @ q[i, head] * 0.25).softmax(0)
            torch.testing.assert_close(got[i, head], weights @ v[:seen, head // group])
