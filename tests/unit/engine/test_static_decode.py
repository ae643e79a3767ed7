"""Decode steps at fixed shapes, on the CPU (eager; CUDA replays the same step as graphs): the
engine's greedy tokens still equal transformers', a padded step's real rows do not depend on
the padding (exactly) and equal the unpadded step's (to float32 rounding), padding rows touch
only the pad page, the step at a size traces as one graph with no host read, and what the
step cannot take is refused."""

from __future__ import annotations

import pytest
import torch

from cadenza.config import EngineConfig
from cadenza.contract.request import SynthesisRequest
from cadenza.contract.sampling import SamplingParams
from cadenza.engine.builder import build_engine, pretrained_config
from cadenza.engine.device_audit import DeviceAudit
from cadenza.engine.engine import Engine
from cadenza.engine.kv.paged_kv_cache import KVSpec, PagedKVCache
from cadenza.engine.models.restricted_heads import RestrictedHeads
from cadenza.engine.sequence import Sequence
from cadenza.engine.static_decode import StaticDecodeStep, fixed_decode_width
from cadenza.kernels.attention_context import AttentionContext, decode_keys
from tests.support.float32_compute import float32_cpu_config
from tests.unit.engine.orpheus_checkpoints import (
    reference_prompt,
    reference_tokens,
    run_to_the_end,
    save_tiny_orpheus,
)

PAGE = 8
GREEDY = SamplingParams(temperature=0.0, top_k=0, repetition_penalty=1.3)
TEXTS = [("tara", "Hi."), ("leo", "Good morning to you all."), ("tara", "How are you?")]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    directory = tmp_path_factory.mktemp("orpheus")
    model = save_tiny_orpheus(directory)
    from transformers import PreTrainedTokenizerFast

    return directory, model, PreTrainedTokenizerFast.from_pretrained(directory)


def _engine(directory, fixed: bool) -> Engine:
    """The tiny Orpheus on the torch step (what a GPU runs), with its decode steps at fixed
    shapes where ``fixed`` (as the builder makes them on CUDA)."""
    config = pretrained_config(
        str(directory),
        dtype="float32",
        codec="snac_24khz",
        codec_noise=False,
        cpu=float32_cpu_config(fused_decode=False, pack_weights=False),
        engine_config=EngineConfig(
            page_size=PAGE, kv_cache_memory_bytes=8 << 20, max_num_seqs=4, max_num_batched_tokens=32
        ),
    )
    return build_engine(config, fixed_decode_shapes=fixed)


def _decoding(engine: Engine, count: int) -> list[Sequence]:
    """``count`` streams of :data:`TEXTS`, stepped until every one decodes, each with a slot
    for its next token (as the scheduler gives it before a step)."""
    for i in range(count):
        voice, text = TEXTS[i % len(TEXTS)]
        engine.add_request(SynthesisRequest(f"s{i}", text, voice, 2.0, GREEDY))
    seqs = [engine.sequence(f"s{i}") for i in range(count)]
    while any(seq.is_prefilling for seq in seqs):
        engine.step()
    for seq in seqs:
        assert engine.kv.allocate_slots(seq, 1)
    return seqs


def _static(engine: Engine) -> StaticDecodeStep:
    step = engine.runner.static_decode
    assert step is not None
    return step


@pytest.mark.parametrize("union", [False, True])
def test_greedy_tokens_equal_transformers_through_padded_steps(checkpoint, union) -> None:
    """As CUDA runs Orpheus: fixed shapes, and (``union``) its one restricted head."""
    directory, reference, tokenizer = checkpoint
    engine = _engine(directory, fixed=True)
    if union:
        masks = engine.layout.sampling_masks()
        heads = RestrictedHeads(engine.model.lm_head.weight, masks, union=True)
        engine.model.output_heads = heads
    step = _static(engine)
    assert engine.kv_cache.pad_page == engine.kv.pool.num_pages  # one page past the pool's
    sizes = []
    run = step.run

    def counted(decodes):
        sizes.append(len(decodes))
        return run(decodes)

    step.run = counted  # type: ignore[method-assign]
    requests = [
        SynthesisRequest(f"r{i}", text, voice, 0.35, GREEDY)
        for i, (voice, text) in enumerate(TEXTS)
    ]
    tokens = run_to_the_end(engine, requests)  # checks the pool's integrity at the end
    assert 3 in sizes  # three decodes ran in a step of four
    for i, (voice, text) in enumerate(TEXTS):
        got = tokens[f"r{i}"]
        prompt = reference_prompt(tokenizer, voice, text)
        assert got == reference_tokens(reference, prompt, len(got), 1.3)


def test_a_padded_step_s_real_rows_do_not_depend_on_the_padding(checkpoint) -> None:
    """Three streams in a step of four: the same rows, exactly, as beside a fourth stream
    (the same size: the same kernels); and the unpadded three to float32 rounding (the CPU's
    matrix products block by the row count: 7e-7 apart at 3 rows and 4 on a 128-wide linear
    layer)."""
    engine = _engine(checkpoint[0], fixed=True)
    step = _static(engine)
    seqs = _decoding(engine, 4)
    with torch.inference_mode():
        padded = step.run(seqs[:3]).clone()
        beside_a_fourth = step.run(seqs)[:3].clone()
        unpadded = _unpadded(engine, step, seqs[:3])
    assert torch.equal(padded, beside_a_fourth)
    assert padded.shape == unpadded.shape and padded.shape[0] == 3
    torch.testing.assert_close(padded, unpadded, rtol=1e-5, atol=1e-5)


def _unpadded(engine: Engine, step: StaticDecodeStep, seqs: list[Sequence]) -> torch.Tensor:
    """The step's forward over exactly ``seqs``, no padding row."""
    page, heads = engine.kv_cache.page_size, engine.kv_cache.spec.num_kv_heads
    count = len(seqs)
    tables = torch.full((count, step.max_pages), -1, dtype=torch.int32)
    for i, seq in enumerate(seqs):
        tables[i, : len(seq.page_table)] = torch.tensor(seq.page_table)
    positions = torch.tensor([seq.num_computed_tokens for seq in seqs])
    lens = (positions + 1).to(torch.int32)
    slots = [
        seq.page_table[p // page] * page + p % page
        for seq, p in zip(seqs, positions.tolist(), strict=True)
    ]
    context = AttentionContext(
        slot_mapping=torch.tensor(slots),
        num_decodes=count,
        decode_page_tables=tables,
        decode_seq_lens=lens,
        prefills=(),
        decode_keys=decode_keys(tables, lens, page, heads, max_len=step.max_pages * page),
        every_slot_set=True,
    )
    ids = torch.tensor([seq.token_rows[seq.num_computed_tokens] for seq in seqs])
    return step.forward(ids, positions, context, engine.kv_cache, torch.arange(count))


def test_padding_rows_write_only_the_pad_page(checkpoint) -> None:
    engine = _engine(checkpoint[0], fixed=True)
    step = _static(engine)
    seqs = _decoding(engine, 3)
    before = engine.kv_cache.keys.clone()
    with torch.inference_mode():
        step.run(seqs)
    changed = (engine.kv_cache.keys != before).flatten(2).any(dim=2).any(dim=0)
    page = engine.kv_cache.page_size
    written = {seq.page_table[seq.num_computed_tokens // page] for seq in seqs}
    assert set(changed.nonzero().flatten().tolist()) <= written | {engine.kv_cache.pad_page}
    assert bool(changed[engine.kv_cache.pad_page])  # the padding row wrote there
    engine.check_integrity()


def test_the_step_at_a_size_traces_as_one_graph_and_reads_nothing_back(checkpoint) -> None:
    engine = _engine(checkpoint[0], fixed=True)
    step = _static(engine)
    seqs = _decoding(engine, 2)
    graphs: list[int] = []

    def keep(graph, _):  # a backend that runs the traced graph as it is
        graphs.append(sum(node.op == "call_function" for node in graph.graph.nodes))
        return graph.forward

    with torch.inference_mode():
        eager = step.run(seqs).clone()
        torch._dynamo.reset()
        traced = torch.compile(step.forward_at, fullgraph=True, backend=keep)(2)[:2]
        with DeviceAudit() as audit:
            step.run(seqs)
    torch._dynamo.reset()
    assert len(graphs) == 1 and graphs[0] > 0
    assert torch.equal(traced, eager)
    assert audit.host_reads == 0


def test_without_fixed_shapes_the_cache_has_no_pad_page_and_steps_run_as_before(
    checkpoint,
) -> None:
    engine = _engine(checkpoint[0], fixed=False)
    assert engine.kv_cache.pad_page is None and engine.runner.static_decode is None


def test_what_the_step_cannot_take_is_refused(checkpoint) -> None:
    spec = KVSpec(num_layers=1, num_kv_heads=1, head_dim=2)
    cpu = torch.device("cpu")
    plain = PagedKVCache(spec, 4, PAGE, torch.float32, cpu)

    def make(cache: PagedKVCache, max_pages: int = 2) -> StaticDecodeStep:
        return StaticDecodeStep(
            lambda *inputs: inputs[0].float(),
            cache,
            num_codebooks=1,
            max_batch=2,
            max_pages=max_pages,
            gathers_keys=False,
            device=cpu,
        )

    with pytest.raises(ValueError, match="pad page"):
        make(plain)
    padded = PagedKVCache(spec, 4, PAGE, torch.float32, cpu, pad_page=True)
    with pytest.raises(ValueError, match="max_pages"):
        make(padded, max_pages=0)
    step = make(padded)
    seq = Sequence("wide", [[1]] * 30, GREEDY, torch.Generator(), 10)
    seq.num_computed_tokens, seq.page_table = 29, [0, 1, 2, 3]
    with pytest.raises(ValueError, match="4 pages exceeds 2"):
        step.run([seq])
    with pytest.raises(ValueError, match="exceed the largest bucket 2"):
        step.run([seq] * 3)
    with pytest.raises(ValueError, match="CUDA device"):
        step.capture()
    assert not step.takes(0) and step.takes(2) and not step.takes(3)


def test_the_fixed_width_covers_the_model_s_context_within_the_pool() -> None:
    assert fixed_decode_width(100, 16, None) == 100
    assert fixed_decode_width(100, 16, 2048) == 100
    assert fixed_decode_width(1000, 16, 2048) == 128
    assert fixed_decode_width(1000, 16, 1) == 1


def test_a_failed_capture_leaves_the_steps_eager_and_serving(checkpoint, caplog) -> None:
    engine = _engine(checkpoint[0], fixed=True)
    step = _static(engine)
    # On the CPU the capture refuses (no CUDA device): as a failing capture on a GPU would.
    assert engine.runner.capture_graphs() == 0
    assert "run eagerly" in caplog.text and not step.graphed
    seqs = _decoding(engine, 2)
    with torch.inference_mode():
        assert step.run(seqs).shape[0] == 2
