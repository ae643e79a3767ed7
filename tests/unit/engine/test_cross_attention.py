"""Each stream's tokens attend to its own encoder keys only, exactly as alone."""

from __future__ import annotations

import torch
from torch.nn import functional

from cadenza.engine.models.cross_attention import CrossKV, attend_streams


def reference(q: torch.Tensor, kv: CrossKV, scale: float) -> torch.Tensor:
    groups = q.shape[1] // kv.keys.shape[0]
    keys = kv.keys.repeat_interleave(groups, dim=0)
    values = kv.values.repeat_interleave(groups, dim=0)
    weights = (q.transpose(0, 1) @ keys.transpose(1, 2) * scale).softmax(dim=-1)
    return (weights @ values).transpose(0, 1)


def test_every_stream_attends_to_its_own_keys_with_grouped_heads() -> None:
    torch.manual_seed(0)
    heads, kv_heads, dim = 8, 2, 16
    counts = (1, 5, 0, 1, 3)
    kv = [
        CrossKV(torch.randn(kv_heads, length, dim), torch.randn(kv_heads, length, dim))
        for length in (7, 3, 4, 12, 1)
    ]
    q = torch.randn(sum(counts), heads, dim)
    out = attend_streams(q, kv, counts, scale=0.5)
    start = 0
    for count, item in zip(counts, kv, strict=True):
        expected = reference(q[start : start + count], item, 0.5)
        torch.testing.assert_close(out[start : start + count], expected, atol=1e-5, rtol=1e-5)
        start += count


def test_a_stream_alone_equals_scaled_dot_product_attention() -> None:
    torch.manual_seed(1)
    kv = CrossKV(torch.randn(4, 9, 8), torch.randn(4, 9, 8))
    q = torch.randn(2, 4, 8)
    expected = functional.scaled_dot_product_attention(
        q.transpose(0, 1), kv.keys, kv.values, scale=1.0
    ).transpose(0, 1)
    assert torch.equal(attend_streams(q, [kv], (2,), scale=1.0), expected)
    assert kv.nbytes == 2 * 4 * 9 * 8 * 4
