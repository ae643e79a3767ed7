"""The paged engine against transformers: greedy tokens must be identical in every
scheduling situation (batching, ragged arrivals, chunked prefill, prefix hits, preemption)."""

from __future__ import annotations

import random

import pytest
import torch

from cadenza.config import EngineConfig
from cadenza.contract.sampling import SamplingParams
from cadenza.engine.engine import Engine
from cadenza.engine.kv.paged_kv_cache import KVSpec
from cadenza.engine.offline import generate_ids
from cadenza.engine.sequence import SequenceStatus
from tests.unit.engine.llama_checkpoints import CONFIGS, hf_greedy, save_tiny_llama

GREEDY = SamplingParams(temperature=0.0, top_k=0)


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def checkpoint(request, tmp_path_factory):
    directory = tmp_path_factory.mktemp(request.param)
    model = save_tiny_llama(directory, request.param)
    return directory, model


def _engine(directory, **config):
    defaults = {"page_size": 4, "kv_cache_memory_bytes": 4 << 20}
    return Engine.from_pretrained(
        str(directory),
        dtype="float32",  # named: float32 products and cache, as transformers computes
        engine_config=EngineConfig(**{**defaults, **config}),
    )


def _prompts(count, seed, low=3, high=30):
    rng = random.Random(seed)
    return [[rng.randrange(3, 256) for _ in range(rng.randint(low, high))] for _ in range(count)]


def _assert_clean(engine):
    engine.check_integrity()
    assert engine.kv.pool.num_free_pages == engine.kv.pool.num_pages


def test_one_request(checkpoint):
    directory, reference = checkpoint
    engine = _engine(directory)
    prompt = _prompts(1, seed=1)[0]
    assert generate_ids(engine, [prompt], 24) == [hf_greedy(reference, prompt, 24)]
    _assert_clean(engine)


def test_batched_requests_of_ragged_lengths(checkpoint):
    directory, reference = checkpoint
    engine = _engine(directory)
    prompts = _prompts(6, seed=2)
    got = generate_ids(engine, prompts, 20)
    assert got == [hf_greedy(reference, p, 20) for p in prompts]
    assert max(step.decodes for step in engine.take_report().steps) == len(prompts)  # batched
    _assert_clean(engine)


def test_requests_arriving_at_different_steps(checkpoint):
    directory, reference = checkpoint
    engine = _engine(directory, max_num_seqs=4, max_num_batched_tokens=64)
    prompts = _prompts(7, seed=3)
    arrivals = {0: [0, 1], 3: [2], 4: [3, 4], 11: [5], 12: [6]}
    seqs = {}
    step = 0
    while step <= max(arrivals) or engine.has_unfinished_requests():
        for index in arrivals.get(step, []):
            seqs[index] = engine.add_tokens(f"r{index}", [[t] for t in prompts[index]], 16, GREEDY)
        engine.step()
        engine.check_integrity()
        step += 1
    for index, seq in seqs.items():
        assert seq.status is SequenceStatus.FINISHED
        assert [row[0] for row in seq.output_rows] == hf_greedy(reference, prompts[index], 16)
    _assert_clean(engine)


def test_chunked_prefill_under_a_small_token_budget(checkpoint):
    directory, reference = checkpoint
    engine = _engine(directory, max_num_batched_tokens=8, max_num_seqs=4)
    prompts = _prompts(4, seed=4, low=20, high=40)
    assert generate_ids(engine, prompts, 12) == [hf_greedy(reference, p, 12) for p in prompts]
    _assert_clean(engine)


def test_prefix_cache_hits_give_identical_tokens(checkpoint):
    directory, reference = checkpoint
    engine = _engine(directory, page_size=8)
    shared = _prompts(1, seed=5, low=33, high=33)[0]
    prompts = [shared + tail for tail in _prompts(4, seed=6, low=1, high=9)]
    first = generate_ids(engine, prompts[:1], 10)
    rest = generate_ids(engine, prompts[1:], 10)
    assert first + rest == [hf_greedy(reference, p, 10) for p in prompts]
    stats = engine.stats()
    assert stats.prefix_hit_tokens >= 3 * 32  # 4 full pages of the shared prefix, 3 times
    _assert_clean(engine)


def test_preemption_recomputes_and_still_matches(checkpoint):
    directory, reference = checkpoint
    # A pool of 24 pages of 4 tokens: enough for every prompt, not for every output at once.
    config = reference.config
    spec = KVSpec(config.num_hidden_layers, config.num_key_value_heads, config.head_dim)
    engine = _engine(
        directory,
        page_size=4,
        reserve_max_output=False,
        kv_cache_memory_bytes=24 * spec.bytes_per_page(4, torch.float32),
        max_num_seqs=8,
    )
    prompts = _prompts(5, seed=7, low=8, high=14)
    got = generate_ids(engine, prompts, 24)
    assert engine.stats().num_preemptions > 0
    assert got == [hf_greedy(reference, p, 24) for p in prompts]
    _assert_clean(engine)


def test_stop_ids_end_a_token_request_like_eos(checkpoint):
    directory, reference = checkpoint
    engine = _engine(directory)
    prompt = _prompts(1, seed=7)[0]
    expected = hf_greedy(reference, prompt, 12)
    stop = expected[4]
    sampling = SamplingParams(temperature=0.0, top_k=0, stop_ids=(stop,))
    seq = engine.add_tokens("stop", [[t] for t in prompt], 12, sampling)
    while engine.has_unfinished_requests():
        engine.step()
    got = [row[0] for row in seq.output_rows]
    assert got == expected[: expected.index(stop) + 1]
    _assert_clean(engine)


def test_float32_named_is_float32_math_with_the_fused_step(checkpoint):
    """``dtype="float32"`` as a new user writes it (no other setting): float32 products, KV
    cache and logits, the fused native step on where a compiler is, and greedy tokens equal to
    transformers' float32 for every prompt."""
    from cadenza.kernels.fused_cpu_decode import unsupported_reason
    from cadenza.kernels.native.loader import find_compiler

    directory, reference = checkpoint
    engine = Engine.from_pretrained(
        str(directory), dtype="float32", page_size=4, kv_cache_memory_bytes=4 << 20
    )
    precision = engine.precision
    assert precision is not None and precision.chosen_by == "named"
    assert (precision.products, precision.kv_cache, precision.logits) == (
        "float32",
        "fp32",
        "float32",
    )
    assert precision.lowered == ()
    fits = unsupported_reason(engine.model.model) is None  # the kernel's widths: gqa3's fit
    assert engine.runner.fused_decode == (fits and find_compiler() is not None)
    prompts = _prompts(10, seed=11)
    assert generate_ids(engine, prompts, 24) == [hf_greedy(reference, p, 24) for p in prompts]
    _assert_clean(engine)


def test_auto_says_what_it_lowered(checkpoint):
    from cadenza.kernels.cpu_linear import native_bf16_matmul

    directory, _ = checkpoint
    engine = Engine.from_pretrained(str(directory), page_size=4, kv_cache_memory_bytes=4 << 20)
    precision = engine.precision
    assert precision is not None and precision.chosen_by == "auto"
    assert precision.logits == "float32"
    if native_bf16_matmul():
        assert "bfloat16 products" in precision.lowered
        assert "lowered for speed" in precision.describe()
    else:
        assert precision.lowered == ()
