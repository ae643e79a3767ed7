"""The attention backends behind one protocol: which one a device gets, and a step's attention
(store, decode tokens, prefill chunks) equal to the torch functions called one by one."""

from __future__ import annotations

import pytest
import torch

from cadenza.kernels import paged_decode_attention, torch_attention
from cadenza.kernels.attention_backends import (
    AttentionBackend,
    TorchAttentionBackend,
    TritonAttentionBackend,
    attention_backend_for,
)
from cadenza.kernels.attention_context import AttentionContext, PrefillSpan
from cadenza.kernels.triton_support import triton_can_run, triton_installed

CPU, CUDA = torch.device("cpu"), torch.device("cuda")
PAGE, HEADS, KV_HEADS, DIM = 4, 4, 2, 64


def test_the_model_layers_get_triton_only_where_it_runs_compiled() -> None:
    assert attention_backend_for(CPU).name == "torch"  # even under TRITON_INTERPRET=1
    assert attention_backend_for(CUDA).name == ("triton" if triton_installed() else "torch")


def test_the_interpreter_counts_only_when_asked_for() -> None:
    expected = "triton" if triton_can_run(CPU) else "torch"
    assert attention_backend_for(CPU, torch.float32, interpreter=True).name == expected
    assert attention_backend_for(CPU, torch.float16, interpreter=True).name == expected


def test_a_dtype_the_triton_kernel_does_not_take_goes_to_torch() -> None:
    for device in (CPU, CUDA):
        backend = attention_backend_for(device, torch.float64, interpreter=True)
        assert isinstance(backend, TorchAttentionBackend) and backend.name == "torch"


def _step(seed: int = 0):
    """One layer of a step: two decode tokens (positions 5 and 2) and a prefill chunk of three
    tokens (positions 4-6), over a cache whose earlier positions hold random keys."""
    generator = torch.Generator().manual_seed(seed)
    k_cache = torch.randn(8, PAGE, KV_HEADS, DIM, generator=generator)
    v_cache = torch.randn(8, PAGE, KV_HEADS, DIM, generator=generator)
    q = torch.randn(5, HEADS, DIM, generator=generator)
    k = torch.randn(5, KV_HEADS, DIM, generator=generator)
    v = torch.randn(5, KV_HEADS, DIM, generator=generator)
    tables = torch.tensor([[0, 1], [2, -1]], dtype=torch.int32)
    prefill_table = torch.tensor([3, 4], dtype=torch.int32)
    context = AttentionContext(
        slot_mapping=torch.tensor(
            [1 * PAGE + 1, 2 * PAGE + 2, 4 * PAGE, 4 * PAGE + 1, 4 * PAGE + 2]
        ),
        num_decodes=2,
        decode_page_tables=tables,
        decode_seq_lens=torch.tensor([6, 3], dtype=torch.int32),
        prefills=(
            PrefillSpan(query_start=2, query_len=3, context_len=7, page_table=prefill_table),
        ),
    )
    return q, k, v, k_cache, v_cache, context


def _one_by_one(q, k, v, k_cache, v_cache, context: AttentionContext) -> torch.Tensor:
    torch_attention.store_kv(k, v, k_cache, v_cache, context.slot_mapping)
    decodes = torch_attention.torch_paged_decode_attention(
        q[:2], k_cache, v_cache, context.decode_page_tables, context.decode_seq_lens, 0.125
    )
    span = context.prefills[0]
    prefill = torch_attention.torch_paged_prefill_attention(
        q[2:], k_cache, v_cache, span.page_table, span.context_len, 0.125
    )
    return torch.cat([decodes, prefill])


def _backends() -> list[AttentionBackend]:
    backends: list[AttentionBackend] = [TorchAttentionBackend()]
    if triton_can_run(CPU):
        backends.append(TritonAttentionBackend())
    return backends


@pytest.mark.parametrize("backend", _backends(), ids=lambda backend: backend.name)
def test_a_step_stores_then_attends_decodes_then_prefills(backend: AttentionBackend) -> None:
    q, k, v, k_cache, v_cache, context = _step()
    expected = _one_by_one(q, k, v, k_cache.clone(), v_cache.clone(), context)
    out = backend.forward(q, k, v, k_cache, v_cache, context, 0.125)
    assert torch.equal(k_cache.view(-1, KV_HEADS, DIM)[context.slot_mapping], k)
    assert torch.equal(v_cache.view(-1, KV_HEADS, DIM)[context.slot_mapping], v)
    if backend.name == "torch":
        assert torch.equal(out, expected)  # the same calls, the same numbers
    else:
        torch.testing.assert_close(out, expected, atol=2e-5, rtol=2e-5)


def test_the_public_decode_attention_is_the_chosen_backend_s() -> None:
    q, k, v, k_cache, v_cache, context = _step(1)
    torch_attention.store_kv(k, v, k_cache, v_cache, context.slot_mapping)
    args = (q[:2], k_cache, v_cache, context.decode_page_tables, context.decode_seq_lens, 0.125)
    backend = attention_backend_for(CPU, torch.float32, interpreter=True)
    assert torch.equal(paged_decode_attention(*args), backend.decode(*args))
    doubles = tuple(a.double() if a.is_floating_point() else a for a in args[:-1])
    assert torch.equal(
        paged_decode_attention(*doubles, 0.125),  # float64: torch, Triton or not
        torch_attention.torch_paged_decode_attention(*doubles, 0.125),
    )
