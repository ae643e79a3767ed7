"""Model runner with a fake model: batch flattening, attention context, failure isolation."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from cadenza.contract.sampling import SamplingParams
from cadenza.engine import model_runner
from cadenza.engine.kv.paged_kv_cache import KVSpec, PagedKVCache
from cadenza.engine.layouts.delay_pattern import DelayPatternLayout
from cadenza.engine.layouts.token_layout import PlainLayout, TokenLayout
from cadenza.engine.model_runner import ModelRunner
from cadenza.engine.models.model import AudioTokenModel
from cadenza.engine.scheduler import ScheduledBatch
from cadenza.engine.sequence import Sequence
from cadenza.kernels.attention_context import AttentionContext

PAGE = 4
VOCAB = 32
POISON = 31  # a forward whose batch holds this id raises
NAN = 30  # logits taken at this id are NaN
GREEDY = SamplingParams(temperature=0.0)


class RecordingModel(AudioTokenModel):
    """Logits that make greedy sampling pick ``(id + 1) % vocab_size`` for every codebook,
    where ``id`` is codebook 0 of the token the logits are taken at; every call is recorded."""

    def __init__(self, layout: TokenLayout | None = None, vocab_size: int = VOCAB) -> None:
        super().__init__()
        self.layout = layout or PlainLayout()
        self.kv_spec = KVSpec(num_layers=1, num_kv_heads=1, head_dim=2)
        self.vocab_size = vocab_size
        self.anchor = nn.Parameter(torch.zeros(1))  # gives the model a device and dtype
        self.calls: list[dict] = []

    def forward(self, input_ids, positions, context, kv_cache, logits_indices) -> torch.Tensor:
        self.calls.append(
            {
                "input_ids": input_ids.clone(),
                "positions": positions.clone(),
                "context": context,
                "logits_indices": logits_indices.clone(),
            }
        )
        if bool((input_ids == POISON).any()):
            raise RuntimeError("poisoned batch")
        last = input_ids[logits_indices, 0]
        target = (last + 1) % self.vocab_size
        ids = torch.arange(self.vocab_size)
        logits = -(ids[None, :] - target[:, None]).abs().float()  # [S, V], peak at target
        logits = logits[:, None, :].expand(-1, self.layout.num_codebooks, -1).clone()
        logits[last == NAN] = float("nan")
        return logits


def make_runner(
    layout: TokenLayout | None = None, vocab_size: int = VOCAB
) -> tuple[ModelRunner, RecordingModel]:
    model = RecordingModel(layout, vocab_size)
    cache = PagedKVCache(model.kv_spec, 16, PAGE, torch.float32, torch.device("cpu"))
    return ModelRunner(model, cache), model


def make_seq(
    request_id: str,
    ids: list[int],
    computed: int,
    pages: list[int],
    sampling: SamplingParams = GREEDY,
) -> Sequence:
    """A sequence mid-flight: ``ids`` as rows, ``computed`` of them cached in ``pages``."""
    seq = Sequence(request_id, [[i] for i in ids], sampling, torch.Generator(), 100)
    seq.num_computed_tokens = computed
    seq.page_table = list(pages)
    return seq


def mixed_batch() -> tuple[ScheduledBatch, dict[str, Sequence]]:
    seqs = {
        # two decodes: positions 5 and 1
        "d0": make_seq("d0", [1, 2, 3, 4, 5, 6], computed=5, pages=[3, 7]),
        "d1": make_seq("d1", [8, 9], computed=1, pages=[1]),
        # a prefill that finishes its prompt (samples) and one that does not
        "p0": make_seq("p0", [10, 11, 12, 13, 14, 15], computed=2, pages=[0, 5]),
        "p1": make_seq("p1", list(range(16, 26)), computed=0, pages=[4, 6, 2]),
    }
    batch = ScheduledBatch(
        decodes=[seqs["d0"], seqs["d1"]],
        prefills=[(seqs["p0"], 4), (seqs["p1"], 3)],
    )
    return batch, seqs


def state(seq: Sequence) -> dict:
    fields = vars(seq).copy()
    fields.pop("generator")
    return copy.deepcopy(fields)


# -- flattening -----------------------------------------------------------------------------


def test_the_batch_is_flattened_decodes_first_then_prefill_chunks() -> None:
    runner, model = make_runner()
    batch, seqs = mixed_batch()
    result = runner.run(batch)
    (call,) = model.calls
    assert call["input_ids"][:, 0].tolist() == [6, 9, 12, 13, 14, 15, 16, 17, 18]
    assert call["positions"].tolist() == [5, 1, 2, 3, 4, 5, 0, 1, 2]
    assert call["logits_indices"].tolist() == [0, 1, 5]  # p1's chunk does not end its prompt
    assert result.rows == [(seqs["d0"], [7]), (seqs["d1"], [10]), (seqs["p0"], [16])]
    assert result.failed == []


def test_cache_slots_are_page_times_page_size_plus_offset() -> None:
    runner, model = make_runner()
    batch, _ = mixed_batch()
    runner.run(batch)
    context: AttentionContext = model.calls[0]["context"]
    assert context.slot_mapping.dtype == torch.int64
    assert context.slot_mapping.tolist() == [
        7 * PAGE + 1,  # d0 position 5: second page, offset 1
        1 * PAGE + 1,  # d1 position 1
        0 * PAGE + 2,  # p0 positions 2..5
        0 * PAGE + 3,
        5 * PAGE + 0,
        5 * PAGE + 1,
        4 * PAGE + 0,  # p1 positions 0..2
        4 * PAGE + 1,
        4 * PAGE + 2,
    ]


def test_the_attention_context_describes_decodes_and_prefill_spans() -> None:
    runner, model = make_runner()
    batch, _ = mixed_batch()
    runner.run(batch)
    context: AttentionContext = model.calls[0]["context"]
    assert context.num_decodes == 2
    assert context.decode_page_tables.tolist() == [[3, 7], [1, -1]]  # -1 padded
    assert context.decode_page_tables.dtype == torch.int32
    assert context.decode_seq_lens.tolist() == [6, 2]  # cached after this step
    spans = [
        (s.query_start, s.query_len, s.context_len, s.page_table.tolist()) for s in context.prefills
    ]
    assert spans == [(2, 4, 6, [0, 5]), (6, 3, 3, [4, 6, 2])]
    keys = context.decode_keys
    assert keys is not None
    assert keys.mask.tolist() == [[True] * 6, [True, True] + [False] * 4]
    assert keys.slots[0].tolist() == [12, 13, 14, 15, 28, 29]
    assert keys.slots[1, :2].tolist() == [4, 5]
    heads = model.kv_spec.num_kv_heads
    assert keys.rows.shape == (2, heads, 6)
    assert keys.rows[0, :, 0].tolist() == [12 * heads + h for h in range(heads)]
    assert keys.bias[1, 0, 0].tolist() == [0.0, 0.0] + [float("-inf")] * 4


def test_a_prefill_only_batch_has_an_empty_decode_context() -> None:
    runner, model = make_runner()
    seq = make_seq("p", [3, 4, 5], computed=0, pages=[9])
    result = runner.run(ScheduledBatch(prefills=[(seq, 3)]))
    context: AttentionContext = model.calls[0]["context"]
    assert context.num_decodes == 0
    assert tuple(context.decode_page_tables.shape) == (0, 0)
    assert context.decode_seq_lens.tolist() == []
    assert context.slot_mapping.tolist() == [36, 37, 38]
    assert result.rows == [(seq, [6])]


def test_a_chunk_that_does_not_finish_its_prompt_samples_nothing() -> None:
    runner, model = make_runner()
    seq = make_seq("p", list(range(10)), computed=4, pages=[0, 1, 2])
    result = runner.run(ScheduledBatch(prefills=[(seq, 4)]))
    assert model.calls[0]["logits_indices"].tolist() == []
    assert result.rows == [] and result.failed == []


def test_an_empty_batch_returns_an_empty_result_without_calling_the_model() -> None:
    runner, model = make_runner()
    result = runner.run(ScheduledBatch())
    assert result.rows == [] and result.failed == []
    assert model.calls == []


def test_the_runner_never_changes_a_sequence() -> None:
    runner, _ = make_runner()
    batch, seqs = mixed_batch()
    before = {name: state(seq) for name, seq in seqs.items()}
    runner.run(batch)
    assert {name: state(seq) for name, seq in seqs.items()} == before


def test_the_layouts_forced_ids_and_masks_shape_the_rows() -> None:
    layout = DelayPatternLayout(num_codebooks=3, codebook_size=8, pad_id=8, eos_id=9)
    runner, _ = make_runner(layout, vocab_size=10)
    first = Sequence("a", [[8, 8, 8]], GREEDY, torch.Generator(), 10)
    first.page_table = [0]
    later = Sequence("b", [[8, 8, 8]], GREEDY, torch.Generator(), 10)
    for row in ([1, 8, 8], [8, 8, 8], [1, 2, 3]):
        later.append(row)
    later.num_computed_tokens, later.page_table = 3, [1]
    result = runner.run(ScheduledBatch(decodes=[later], prefills=[(first, 1)]))
    rows = {seq.request_id: row for seq, row in result.rows}
    # The fake model wants id 9 (EOS) at first's pad row: only codebook 0 may emit it, and
    # the late codebooks are forced to pad on a delay pattern's first step.
    assert rows["a"] == [9, 8, 8]
    # At later's step 3 nothing is forced; it wants id 2 everywhere, which every codebook allows.
    assert rows["b"] == [2, 2, 2]


# -- failure isolation ----------------------------------------------------------------------


def test_a_poisoned_sequence_fails_alone_after_each_sequence_is_retried() -> None:
    runner, model = make_runner()
    good = make_seq("good", [1, 2, 3], computed=2, pages=[0])
    bad = make_seq("bad", [4, POISON, 6], computed=0, pages=[1])
    also_good = make_seq("also", [7, 8], computed=0, pages=[2])
    batch = ScheduledBatch(decodes=[good], prefills=[(bad, 3), (also_good, 2)])
    before = {seq.request_id: state(seq) for seq in (good, bad, also_good)}
    result = runner.run(batch)
    assert [(seq.request_id, error) for seq, error in result.failed] == [
        ("bad", "RuntimeError: poisoned batch")
    ]
    assert [(seq.request_id, row) for seq, row in result.rows] == [("good", [4]), ("also", [9])]
    # One batched call, then each sequence alone, each with the right kind of step.
    assert len(model.calls) == 4
    alone = [call["context"] for call in model.calls[1:]]
    assert [(c.num_decodes, len(c.prefills)) for c in alone] == [(1, 0), (0, 1), (0, 1)]
    assert {seq.request_id: state(seq) for seq in (good, bad, also_good)} == before


def test_a_poisoned_chunk_that_would_not_sample_still_fails() -> None:
    runner, _ = make_runner()
    good = make_seq("good", [1, 2], computed=1, pages=[0])
    bad = make_seq("bad", [POISON, 1, 2, 3, 4, 5], computed=0, pages=[1, 2])
    result = runner.run(ScheduledBatch(decodes=[good], prefills=[(bad, 2)]))
    assert [seq.request_id for seq, _ in result.failed] == ["bad"]
    assert result.rows == [(good, [3])]


def test_when_every_sequence_is_poisoned_all_fail_and_nothing_samples() -> None:
    runner, _ = make_runner()
    a = make_seq("a", [1, POISON], computed=1, pages=[0])
    b = make_seq("b", [2, POISON], computed=0, pages=[1])
    result = runner.run(ScheduledBatch(decodes=[a], prefills=[(b, 2)]))
    assert [seq.request_id for seq, _ in result.failed] == ["a", "b"]
    assert result.rows == []


def test_nan_logits_fail_only_their_sequence() -> None:
    runner, _ = make_runner()
    good = make_seq("good", [1, 2], computed=1, pages=[0])
    bad = make_seq("bad", [3, NAN], computed=1, pages=[1])
    late = make_seq("late", [4, 5, 6], computed=0, pages=[2])
    result = runner.run(ScheduledBatch(decodes=[good, bad], prefills=[(late, 3)]))
    assert [(seq.request_id, error) for seq, error in result.failed] == [
        ("bad", "RuntimeError: the model produced NaN logits")
    ]
    assert [(seq.request_id, row) for seq, row in result.rows] == [("good", [3]), ("late", [7])]


def test_a_sampler_error_fails_that_steps_samplers_only(monkeypatch) -> None:
    runner, _ = make_runner()

    def broken(*args, **kwargs):
        raise ValueError("sampler broke")

    monkeypatch.setattr(model_runner, "sample_ids", broken)
    decoding = make_seq("dec", [1, 2], computed=1, pages=[0])
    nan = make_seq("nan", [3, NAN], computed=1, pages=[1])
    chunk = make_seq("chunk", list(range(10)), computed=0, pages=[2, 3, 4])
    result = runner.run(ScheduledBatch(decodes=[decoding, nan], prefills=[(chunk, 4)]))
    failed = [(seq.request_id, error) for seq, error in result.failed]
    assert sorted(failed) == [
        ("dec", "ValueError: sampler broke"),
        ("nan", "RuntimeError: the model produced NaN logits"),  # failed once, for its NaN
    ]
    assert result.rows == []  # chunk sampled nothing this step, so it did not fail


@pytest.mark.parametrize("sampling", [GREEDY, SamplingParams(seed=3, top_k=4)])
def test_a_seeded_sequence_samples_the_same_row_alone_or_in_a_batch(sampling) -> None:
    def sample(batch_mates: int) -> list[int]:
        runner, _ = make_runner()
        seq = make_seq("s", [5, 6], computed=1, pages=[0], sampling=sampling)
        seq.generator.manual_seed(3)
        others = [make_seq(f"o{i}", [i, i], 1, [i + 1]) for i in range(batch_mates)]
        rows = dict(runner.run(ScheduledBatch(decodes=[*others, seq])).rows)
        return rows[seq]

    assert sample(0) == sample(3)
