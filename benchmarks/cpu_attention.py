"""CPU decode attention: the naive per-sequence loop, gather + SDPA (the engine's backend below
256 positions), page-granular gather + SDPA, a GQA-packed einsum and the dense decode copy
(the engine's backend from 256 positions), side by side; then the engine's whole
decode step with the naive loop against the tuned backend.

    python benchmarks/cpu_attention.py

Prints one JSON object (medians of repeated runs, microseconds per call / milliseconds per
step). Shapes are cadenza-tiny's: 4 query and 2 KV heads of width 64, 16-token pages.
"""

from __future__ import annotations

import functools
import json
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from cadenza.kernels import torch_attention
from cadenza.kernels.attention_backends import TorchAttentionBackend
from cadenza.kernels.attention_context import DecodeKeys, decode_key_slots, decode_keys
from cadenza.kernels.dense_decode_kv import DenseDecodeKV, DenseDecodeStep

HEADS, KV_HEADS, DIM, BLOCK = 4, 2, 64, 16


def _median_us(fn: Callable[[], Any], repeats: int = 50) -> float:
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1e6 * statistics.median(times)


def _loop(
    q: Tensor, k_cache: Tensor, v_cache: Tensor, tables: Tensor, lens: Tensor, scale: float
) -> Tensor:
    outputs = []
    for row in range(q.shape[0]):
        n = int(lens[row])
        keys = torch_attention.gather_pages(k_cache, tables[row], n).transpose(0, 1)
        values = torch_attention.gather_pages(v_cache, tables[row], n).transpose(0, 1)
        outputs.append(
            F.scaled_dot_product_attention(
                q[row][:, None], keys, values, scale=scale, enable_gqa=True
            )[:, 0]
        )
    return torch.stack(outputs)


def _gqa_sdpa(q: Tensor, keys: Tensor, values: Tensor, mask: Tensor, scale: float) -> Tensor:
    """One query per sequence over ``keys, values [B, L, Hkv, D]`` through SDPA's GQA path."""
    return F.scaled_dot_product_attention(
        q[:, :, None],
        keys.transpose(1, 2),
        values.transpose(1, 2),
        attn_mask=mask[:, None, None],
        scale=scale,
        enable_gqa=True,
    )[:, :, 0]


def _page_gather(
    q: Tensor, k_cache: Tensor, v_cache: Tensor, tables: Tensor, lens: Tensor, scale: float
) -> Tensor:
    batch = q.shape[0]
    pages = -(-int(lens.max()) // BLOCK)
    table = tables[:, :pages].long().clamp(min=0).reshape(-1)
    keys = k_cache.index_select(0, table).view(batch, pages * BLOCK, KV_HEADS, DIM)
    values = v_cache.index_select(0, table).view(batch, pages * BLOCK, KV_HEADS, DIM)
    mask = torch.arange(pages * BLOCK)[None, :] < lens[:, None]
    return _gqa_sdpa(q, keys, values, mask, scale)


def _flat_gather(
    q: Tensor, k_cache: Tensor, v_cache: Tensor, tables: Tensor, lens: Tensor, scale: float
) -> Tensor:
    """Slot-major gather ``[B, L, Hkv, D]`` and SDPA's GQA path (the backend until 2026-12)."""
    slots, mask = decode_key_slots(tables, lens, BLOCK)
    batch, flat = q.shape[0], slots.reshape(-1)
    keys = k_cache.view(-1, KV_HEADS, DIM).index_select(0, flat).view(batch, -1, KV_HEADS, DIM)
    values = v_cache.view(-1, KV_HEADS, DIM).index_select(0, flat).view(batch, -1, KV_HEADS, DIM)
    return _gqa_sdpa(q, keys, values, mask, scale)


def _packed_einsum(
    q: Tensor, k_cache: Tensor, v_cache: Tensor, tables: Tensor, lens: Tensor, scale: float
) -> Tensor:
    slots, mask = decode_key_slots(tables, lens, BLOCK)
    batch, flat = q.shape[0], slots.reshape(-1)
    keys = k_cache.view(-1, KV_HEADS, DIM).index_select(0, flat).view(batch, -1, KV_HEADS, DIM)
    values = v_cache.view(-1, KV_HEADS, DIM).index_select(0, flat).view(batch, -1, KV_HEADS, DIM)
    grouped = q.view(batch, KV_HEADS, HEADS // KV_HEADS, DIM)
    scores = torch.einsum("bhgd,blhd->bhgl", grouped, keys) * scale
    probs = scores.masked_fill(~mask[:, None, None], float("-inf")).softmax(-1)
    return torch.einsum("bhgl,blhd->bhgd", probs, values).reshape(batch, HEADS, DIM)


def attention_variants() -> list[dict[str, Any]]:
    rows = []
    generator = torch.Generator().manual_seed(0)
    for batch, context in ((1, 100), (8, 200), (16, 400), (16, 800), (32, 400), (64, 1000)):
        per_seq = context // BLOCK + 1
        num_pages = batch * per_seq + 4
        k_cache = torch.randn(num_pages, BLOCK, KV_HEADS, DIM, generator=generator)
        v_cache = torch.randn_like(k_cache)
        tables = torch.randperm(num_pages, generator=generator)[: batch * per_seq]
        tables = tables.view(batch, per_seq).int()
        lens = torch.randint(context // 2, context, (batch,), generator=generator).int()
        q = torch.randn(batch, HEADS, DIM, generator=generator)
        keys = decode_keys(tables, lens, BLOCK, KV_HEADS)

        def tuned(
            q: Tensor = q,
            k_cache: Tensor = k_cache,
            v_cache: Tensor = v_cache,
            tables: Tensor = tables,
            lens: Tensor = lens,
            keys: DecodeKeys = keys,
        ) -> Tensor:
            return torch_attention.torch_paged_decode_attention(
                q, k_cache, v_cache, tables, lens, 0.125, keys=keys
            )

        reference = tuned()
        row: dict[str, Any] = {"batch": batch, "context": context}
        inputs = (q, k_cache, v_cache, tables, lens, 0.125)
        for name, fn in (
            ("loop", _loop),
            ("page_gather_sdpa", _page_gather),
            ("flat_gather_sdpa", _flat_gather),
            ("packed_einsum", _packed_einsum),
        ):
            out = fn(*inputs)
            assert float((out - reference).abs().max()) < 1e-4, name
            row[f"{name}_us"] = round(_median_us(functools.partial(fn, *inputs)), 1)
        row["head_gather_sdpa_us"] = round(_median_us(tuned), 1)
        step = _dense_step(q, k_cache, v_cache, tables, lens)
        row["dense_copy_sdpa_us"] = round(
            _median_us(functools.partial(step.attend, 0, q, k_cache, v_cache, 0.125)), 1
        )
        out = step.attend(0, q, k_cache, v_cache, 0.125)
        assert float((out - reference).abs().max()) < 1e-4, "dense"
        rows.append(row)
    return rows


def _dense_step(
    q: Tensor, k_cache: Tensor, v_cache: Tensor, tables: Tensor, lens: Tensor
) -> DenseDecodeStep:
    """A dense decode copy in steady state: a first step copies every sequence's history but
    its newest position in, so the returned step appends one token per sequence (what a live
    decode step does)."""
    dense = DenseDecodeKV(1, KV_HEADS, DIM, torch.float32, torch.device("cpu"), 1 << 34)
    dense.min_context = 0
    owners = list(range(tables.shape[0]))
    finals = lens.numpy() + 1
    first = dense.plan(owners, tables.numpy(), lens.numpy() - 1, finals, BLOCK)
    assert first is not None
    first.attend(0, q, k_cache, v_cache, 0.125)
    step = dense.plan(owners, tables.numpy(), lens.numpy(), finals, BLOCK)
    assert step is not None
    return step


class _LoopBackend(TorchAttentionBackend):
    name = "loop"

    def decode(
        self,
        q: Tensor,
        k_cache: Tensor,
        v_cache: Tensor,
        page_tables: Tensor,
        seq_lens: Tensor,
        scale: float,
        k_scale: Tensor | None = None,
        v_scale: Tensor | None = None,
        keys: DecodeKeys | None = None,
    ) -> Tensor:
        """The per-sequence loop (a float cache: no scales; no precomputed keys)."""
        return _loop(q, k_cache, v_cache, page_tables, seq_lens, scale)


def engine_step(streams: int = 16, steps: int = 60) -> dict[str, Any]:
    from cadenza.contract.request import SynthesisRequest
    from cadenza.contract.sampling import SamplingParams
    from cadenza.engine.engine import Engine

    result: dict[str, Any] = {"streams": streams}
    for name, backend in (("loop", _LoopBackend()), ("tuned", TorchAttentionBackend())):
        engine = Engine.from_pretrained("cadenza-tiny", kv_cache_memory_bytes=256 << 20)
        backbone: Any = engine.model.backbone
        backbone._backends["cpu"] = backend
        for index in range(streams):
            engine.add_request(
                SynthesisRequest(f"s{index}", "x" * 200, sampling=SamplingParams(seed=index))
            )
        for _ in range(30):  # prefill and first chunks
            engine.step()
        times = []
        for _ in range(steps):
            start = time.perf_counter()
            engine.step()
            times.append(time.perf_counter() - start)
        result[f"{name}_step_ms"] = round(1000 * statistics.median(times), 3)
    result["speedup"] = round(result["loop_step_ms"] / result["tuned_step_ms"], 2)
    return result


if __name__ == "__main__":
    report = {"attention": attention_variants(), "engine_step": engine_step()}
    print(json.dumps(report, indent=1))
