"""INT8 KV quantization: per-token, per-head scales; stores through slot mappings; paged
attention over int8 pages against attention over the float values they encode."""

from __future__ import annotations

import torch

from cadenza.kernels import torch_attention
from cadenza.kernels.kv_quant import SCALE_DTYPE, dequantize, quantize_per_token


def test_round_trip_error_is_within_half_a_step_per_token_and_head():
    x = torch.randn(50, 4, 64) * torch.logspace(-3, 2, 50)[:, None, None]
    q, scale = quantize_per_token(x)
    assert q.dtype == torch.int8 and scale.dtype == SCALE_DTYPE and scale.shape == (50, 4)
    error = (dequantize(q, scale, torch.float32) - x).abs()
    step = scale.float()[..., None]
    assert bool((error <= 0.5 * step + 1e-3 * x.abs()).all())
    zeros, zero_scale = quantize_per_token(torch.zeros(3, 2, 8))
    assert bool((zeros == 0).all()) and bool((zero_scale > 0).all())


def test_store_kv_quantizes_through_the_slot_mapping_and_skips_minus_one():
    k_cache = torch.zeros(4, 16, 2, 64, dtype=torch.int8)
    v_cache = torch.zeros_like(k_cache)
    k_scale = torch.zeros(4, 16, 2, dtype=SCALE_DTYPE)
    v_scale = torch.zeros_like(k_scale)
    k, v = torch.randn(3, 2, 64), torch.randn(3, 2, 64)
    slots = torch.tensor([17, -1, 63])
    torch_attention.store_kv(k, v, k_cache, v_cache, slots, k_scale, v_scale)
    flat_k = k_cache.view(-1, 2, 64)
    flat_scale = k_scale.view(-1, 2)
    restored = dequantize(flat_k[[17, 63]], flat_scale[[17, 63]], torch.float32)
    torch.testing.assert_close(restored, k[[0, 2]], atol=0.03, rtol=0.02)
    assert int((flat_k != 0).any(dim=(1, 2)).sum()) == 2


def test_int8_paged_prefill_and_decode_follow_the_float_attention():
    torch.manual_seed(0)
    k_cache = torch.randn(6, 16, 2, 64)
    v_cache = torch.randn(6, 16, 2, 64)
    kq, ks = quantize_per_token(k_cache)
    vq, vs = quantize_per_token(v_cache)
    table = torch.tensor([4, 1, 3], dtype=torch.int32)
    q = torch.randn(5, 8, 64)
    exact = torch_attention.torch_paged_prefill_attention(q, k_cache, v_cache, table, 40, 0.125)
    int8 = torch_attention.torch_paged_prefill_attention(q, kq, vq, table, 40, 0.125, ks, vs)
    cosine = torch.nn.functional.cosine_similarity(exact.flatten(), int8.flatten(), dim=0)
    assert float(cosine) > 0.999
    seq_lens = torch.tensor([40], dtype=torch.int32)
    decode_exact = torch_attention.torch_paged_decode_attention(
        q[-1:], k_cache, v_cache, table[None], seq_lens, 0.125
    )
    decode_int8 = torch_attention.torch_paged_decode_attention(
        q[-1:], kq, vq, table[None], seq_lens, 0.125, k_scale=ks, v_scale=vs
    )
    torch.testing.assert_close(decode_int8, exact[-1:], atol=0.02, rtol=0.02)
    torch.testing.assert_close(decode_exact, exact[-1:], atol=1e-5, rtol=1e-5)


def test_the_contract_counts_the_scales_the_cache_stores() -> None:
    from cadenza.contract.kv_memory import INT8_SCALE_BYTES

    assert torch.empty(0, dtype=SCALE_DTYPE).element_size() == INT8_SCALE_BYTES
