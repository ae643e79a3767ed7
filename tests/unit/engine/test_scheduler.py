"""Scheduler by hand: step order, chunking, admission, preemption, prefix hits, postprocess."""

from __future__ import annotations

import torch
from hypothesis import given, settings, target
from hypothesis import strategies as st

from cadenza.contract.request import FinishReason
from cadenza.contract.sampling import SamplingParams
from cadenza.engine.kv.kv_cache_manager import KVCacheManager
from cadenza.engine.kv.page_pool import PagePool
from cadenza.engine.layouts.delay_pattern import DelayPatternLayout
from cadenza.engine.layouts.token_layout import PlainLayout, TokenLayout
from cadenza.engine.realtime.deadline_policy import DeadlinePolicy
from cadenza.engine.realtime.playout_clock import PlayoutClock
from cadenza.engine.scheduler import ScheduledBatch, Scheduler, StepOutcome, StepResult
from cadenza.engine.sequence import AudioProgress, Sequence, SequenceStatus

PAGE = 4
KEYS = ("model", "float32", "kv=float32")


def make_seq(
    request_id: str,
    prompt_len: int = 3,
    max_new_steps: int = 8,
    *,
    rows: list[list[int]] | None = None,
    extra_keys: tuple[str, ...] = KEYS,
    eos_ids: frozenset[int] = frozenset(),
) -> Sequence:
    if rows is None:
        rows = [[100 + i] for i in range(prompt_len)]
    return Sequence(
        request_id,
        [list(row) for row in rows],
        SamplingParams(),
        torch.Generator(),
        max_new_steps,
        extra_keys=extra_keys,
        eos_ids=eos_ids,
    )


def make_scheduler(
    num_pages: int = 32,
    *,
    budget: int = 16,
    max_seqs: int = 4,
    reserve: bool = True,
    prefix_caching: bool = True,
    layout: TokenLayout | None = None,
    policy: DeadlinePolicy | None = None,
) -> Scheduler:
    kv = KVCacheManager(PagePool(num_pages, prefix_caching), PAGE, reserve_max_output=reserve)
    return Scheduler(kv, layout or PlainLayout(), budget, max_seqs, policy)


def samplers(batch: ScheduledBatch) -> list[Sequence]:
    """The sequences whose last token this batch computes (the ones that sample a row)."""
    return [seq for seq, n in batch.items() if seq.num_computed_tokens + n == seq.num_tokens]


def step(
    scheduler: Scheduler,
    row: list[int] | None = None,
    *,
    failed: tuple[Sequence, ...] = (),
) -> tuple[ScheduledBatch, StepOutcome]:
    """One scheduled step whose 'model' samples ``row`` (default ``[7]``) for every sampler
    and fails the sequences in ``failed``."""
    batch = scheduler.schedule()
    result = StepResult(
        rows=[(seq, list(row or [7])) for seq in samplers(batch) if seq not in failed],
        failed=[(seq, "RuntimeError: boom") for seq in failed],
    )
    outcome = scheduler.postprocess(batch, result)
    scheduler.check_integrity()
    return batch, outcome


def names(seqs) -> list[str]:
    return [seq.request_id for seq in seqs]


def chunks(batch: ScheduledBatch) -> list[tuple[str, int]]:
    return [(seq.request_id, n) for seq, n in batch.prefills]


# -- step order and budget ----------------------------------------------------------------------


def test_decodes_come_before_prefill_chunks_in_the_batch() -> None:
    scheduler = make_scheduler(budget=8)
    short, long = make_seq("short", 2), make_seq("long", 20)
    scheduler.add(short)
    scheduler.add(long)
    first = scheduler.schedule()
    assert chunks(first) == [("short", 2), ("long", 6)]
    scheduler.postprocess(first, StepResult(rows=[(short, [7])]))
    scheduler.check_integrity()

    second = scheduler.schedule()
    assert names(second.decodes) == ["short"]
    assert chunks(second) == [("long", 7)]  # what the decode left of the budget
    assert [(s.request_id, n) for s, n in second.items()] == [("short", 1), ("long", 7)]
    assert second.num_tokens == 8
    scheduler.check_integrity()


def test_the_token_budget_splits_a_long_prompt_into_chunks() -> None:
    scheduler = make_scheduler(budget=8)
    seq = make_seq("long", 21)
    scheduler.add(seq)
    seen = []
    for _ in range(3):
        batch, outcome = step(scheduler)
        seen.append((chunks(batch), seq.num_computed_tokens, len(seq.page_table)))
        if seq.num_generated == 0:
            assert outcome.sampled == []  # nothing samples before the prompt's last token
    assert seen == [
        ([("long", 8)], 8, 2),
        ([("long", 8)], 16, 4),
        ([("long", 5)], 21, 6),
    ]
    assert seq.num_generated == 1 and not seq.is_prefilling
    batch, _ = step(scheduler)
    assert names(batch.decodes) == ["long"] and batch.prefills == []


def test_a_decode_is_never_starved_by_a_prompt_larger_than_the_budget() -> None:
    scheduler = make_scheduler(budget=4)
    running = make_seq("running", 1)
    scheduler.add(running)
    step(scheduler)
    scheduler.add(make_seq("huge", 30))
    for _ in range(5):
        batch, _ = step(scheduler)
        assert names(batch.decodes) == ["running"]
        assert batch.num_tokens <= 4


def test_waiting_sequences_are_admitted_in_arrival_order_and_max_num_seqs_caps_running() -> None:
    scheduler = make_scheduler(max_seqs=2)
    a, b, c = make_seq("a", 2, 1), make_seq("b", 2, 5), make_seq("c", 2, 5)
    for seq in (a, b, c):
        scheduler.add(seq)
    batch, outcome = step(scheduler)
    assert chunks(batch) == [("a", 2), ("b", 2)]
    assert names(scheduler.waiting) == ["c"]
    assert outcome.finished == {a: FinishReason.LENGTH}  # max_new_steps=1: done at once
    batch, _ = step(scheduler)  # a's place is free
    assert names(batch.decodes) == ["b"] and chunks(batch) == [("c", 2)]
    assert names(scheduler.running) == ["b", "c"]


def test_the_budget_admits_a_partial_chunk_and_then_stops_admission() -> None:
    scheduler = make_scheduler(budget=8)
    for name in ("a", "b", "c"):
        scheduler.add(make_seq(name, 6))
    batch = scheduler.schedule()
    assert chunks(batch) == [("a", 6), ("b", 2)]
    assert names(scheduler.waiting) == ["c"]
    scheduler.check_integrity()


def test_a_sequence_that_does_not_fit_blocks_those_behind_it() -> None:
    scheduler = make_scheduler(num_pages=4)
    big = make_seq("big", 10, 10)  # 20 tokens: 5 pages, more than the pool
    small = make_seq("small", 1, 1)
    scheduler.add(big)
    scheduler.add(small)
    batch = scheduler.schedule()
    assert batch.is_empty
    assert names(scheduler.waiting) == ["big", "small"]  # strict arrival order
    assert scheduler.kv.pool.num_free_pages == 4
    scheduler.check_integrity()


# -- reservation and preemption ------------------------------------------------------------


def test_reservation_refuses_admission_when_prompt_and_max_output_do_not_fit() -> None:
    scheduler = make_scheduler(num_pages=4)
    first = make_seq("first", 4, 12)  # 16 tokens: all 4 pages reserved
    second = make_seq("second", 1, 1)  # 2 tokens: 1 page, which is promised to first
    scheduler.add(first)
    scheduler.add(second)
    batch, _ = step(scheduler)
    assert chunks(batch) == [("first", 4)]
    assert first.reserved_pages == 4 and len(first.page_table) == 1
    assert scheduler.kv.outstanding_pages == 3
    assert scheduler.kv.pool.num_free_pages == 3  # free, but reserved
    assert names(scheduler.waiting) == ["second"]
    # first runs to its end without ever being preempted, then second gets in.
    while first.status is SequenceStatus.RUNNING:
        step(scheduler)
    assert first.finish_reason is FinishReason.LENGTH and first.num_generated == 12
    assert scheduler.num_preemptions == 0
    batch, _ = step(scheduler)
    assert chunks(batch) == [("second", 1)]


def test_reservation_counts_every_running_sequence_and_frees_on_finish() -> None:
    scheduler = make_scheduler(num_pages=6)
    a, b, c = make_seq("a", 3, 5), make_seq("b", 3, 5), make_seq("c", 3, 5)  # 2 pages each
    for seq in (a, b, c):
        scheduler.add(seq)
    step(scheduler)
    assert names(scheduler.running) == ["a", "b", "c"]
    d = make_seq("d", 3, 5)
    scheduler.add(d)
    step(scheduler)
    assert names(scheduler.waiting) == ["d"]
    scheduler.finish(b, FinishReason.CANCELLED)
    scheduler.check_integrity()
    batch, _ = step(scheduler)
    assert chunks(batch) == [("d", 3)]
    assert b.status is SequenceStatus.FINISHED and b.page_table == [] and b.reserved_pages == 0


def test_without_reservation_a_full_pool_preempts_the_most_recent_sequence() -> None:
    scheduler = make_scheduler(num_pages=2, reserve=False)
    old, new, late = make_seq("old", 4, 10), make_seq("new", 3, 10), make_seq("late", 1, 10)
    scheduler.add(old)
    scheduler.add(new)
    batch, _ = step(scheduler)
    assert chunks(batch) == [("old", 4), ("new", 3)]
    assert scheduler.kv.pool.num_free_pages == 0
    scheduler.add(late)

    # old's next token starts a new page; the pool is empty, so new (the newest) goes.
    batch, _ = step(scheduler)
    assert names(batch.decodes) == ["old"] and batch.prefills == []
    assert scheduler.num_preemptions == 1 and new.num_preemptions == 1
    assert old.num_preemptions == 0
    assert new.status is SequenceStatus.WAITING
    assert names(scheduler.waiting) == ["new", "late"]  # back at the front
    assert new.page_table == [] and new.num_computed_tokens == 0
    assert new.token_rows == [[100], [101], [102], [7]]  # its tokens so far, kept
    assert new.num_generated == 1  # what it generated still counts toward max_new_steps

    # Once there is room, new recomputes everything it had (its tokens become its prompt).
    scheduler.finish(old, FinishReason.CANCELLED)
    batch, _ = step(scheduler)
    assert chunks(batch)[0] == ("new", 4)
    assert new.num_computed_tokens == 4 and new.num_generated == 2
    assert names(scheduler.running)[0] == "new"


def test_a_sequence_that_cannot_grow_alone_preempts_itself() -> None:
    scheduler = make_scheduler(num_pages=1, reserve=False)
    seq = make_seq("alone", 4, 10)
    scheduler.add(seq)
    step(scheduler)
    batch, _ = step(scheduler)  # needs a second page; nobody else to evict
    assert batch.is_empty
    assert seq.status is SequenceStatus.WAITING and seq.num_preemptions == 1
    assert scheduler.kv.pool.num_free_pages == 1


def _audio_stream(name: str, prompt_len: int, arrival_s: float) -> Sequence:
    seq = Sequence(name, [[16, 16]] * prompt_len, SamplingParams(), torch.Generator(), 50)
    seq.target_frames = 40
    seq.audio = AudioProgress(PlayoutClock(arrival_s, 0.3, 1 / 75, 0.1), codec_slot=0)
    return seq


def test_with_a_deadline_policy_a_preempted_stream_is_not_left_in_the_batch() -> None:
    layout = DelayPatternLayout(num_codebooks=2, codebook_size=16, pad_id=16, eos_id=17)
    policy = DeadlinePolicy(
        layout,
        frame_period_s=1 / 75,
        first_chunk_frames=4,
        chunk_frames=8,
        headroom=0.1,
        min_prefill_tokens=PAGE,
        clock=lambda: 100.0,
    )
    scheduler = make_scheduler(num_pages=2, reserve=False, layout=layout, policy=policy)
    relaxed = _audio_stream("relaxed", 4, arrival_s=100.0)  # admitted first, due later
    urgent = _audio_stream("urgent", 3, arrival_s=50.0)  # admitted second, due first
    scheduler.add(relaxed)
    scheduler.add(urgent)
    step(scheduler, [1, 16])
    batch = scheduler.schedule()
    # urgent decodes first (least laxity); relaxed then needs a page and preempts the newest
    # running sequence, urgent, which is already in batch.decodes.
    for seq, _ in batch.items():
        assert seq.status is SequenceStatus.RUNNING, f"{seq.request_id} was preempted"
        assert len(seq.page_table) * PAGE > seq.num_computed_tokens


# -- prefix hits ----------------------------------------------------------------------------


def test_a_prefix_hit_starts_a_sequence_with_computed_tokens() -> None:
    scheduler = make_scheduler()
    rows = [[5]] * 9  # two full pages of equal rows, then one more token
    first = make_seq("first", rows=rows)
    scheduler.add(first)
    step(scheduler)
    assert len(first.page_hashes) == 2  # both full pages published

    second = make_seq("second", rows=rows)
    scheduler.add(second)
    batch, _ = step(scheduler)
    assert chunks(batch) == [("second", 1)]  # only the last prompt token is computed
    assert second.page_table[:2] == first.page_table[:2]
    assert all(scheduler.kv.pool.ref_counts[p] == 2 for p in first.page_table[:2])
    assert scheduler.kv.prefix_hit_tokens == 8
    assert scheduler.kv.prefix_query_tokens == 18
    assert second.num_computed_tokens == 9 and second.num_generated == 1


def test_a_prefix_hit_never_covers_the_last_prompt_token() -> None:
    scheduler = make_scheduler()
    rows = [[5]] * 8  # exactly two full pages
    scheduler.add(make_seq("first", rows=rows))
    step(scheduler)
    second = make_seq("second", rows=rows)
    scheduler.add(second)
    batch = scheduler.schedule()
    assert chunks(batch) == [("second", 4)]  # one page hit, the second page recomputed
    scheduler.check_integrity()


def test_other_extra_keys_or_other_tokens_miss_the_prefix_cache() -> None:
    scheduler = make_scheduler()
    rows = [[5]] * 9
    scheduler.add(make_seq("first", rows=rows))
    step(scheduler)
    other_voice = make_seq("voice", rows=rows, extra_keys=(*KEYS, "voice=b"))
    other_tokens = make_seq("tokens", rows=[[6]] + [[5]] * 8)
    scheduler.add(other_voice)
    scheduler.add(other_tokens)
    batch = scheduler.schedule()
    assert names(batch.decodes) == ["first"]
    assert chunks(batch) == [("voice", 9), ("tokens", 6)]  # no hit: whole prompts
    assert scheduler.kv.prefix_hit_tokens == 0
    scheduler.check_integrity()


def test_prefix_caching_off_never_hits() -> None:
    scheduler = make_scheduler(prefix_caching=False)
    rows = [[5]] * 9
    first = make_seq("first", rows=rows)
    scheduler.add(first)
    step(scheduler)
    assert first.page_hashes == []
    scheduler.add(make_seq("second", rows=rows))
    batch, _ = step(scheduler)
    assert chunks(batch) == [("second", 9)]


# -- postprocess ----------------------------------------------------------------------------


def test_postprocess_advances_computed_tokens_and_appends_sampled_rows() -> None:
    scheduler = make_scheduler()
    seq = make_seq("s", 3)
    scheduler.add(seq)
    batch, outcome = step(scheduler, [42])
    assert seq.num_computed_tokens == 3
    assert seq.token_rows[-1] == [42] and seq.output_rows == [[42]]
    assert outcome.sampled == [seq] and outcome.finished == {} and outcome.failed == {}
    batch, outcome = step(scheduler, [43])
    assert batch.decodes == [seq]
    assert seq.num_computed_tokens == 4 and seq.output_rows == [[42], [43]]


def test_an_eos_row_finishes_the_sequence_and_releases_its_pages() -> None:
    scheduler = make_scheduler(num_pages=8)
    seq = make_seq("s", 5, eos_ids=frozenset({2}))
    scheduler.add(seq)
    step(scheduler, [9])
    _, outcome = step(scheduler, [2])
    assert outcome.finished == {seq: FinishReason.EOS}
    assert outcome.sampled == [seq]
    assert seq.status is SequenceStatus.FINISHED and seq.finish_reason is FinishReason.EOS
    assert seq.output_rows == [[9], [2]]
    assert seq.page_table == [] and seq.reserved_pages == 0
    assert scheduler.running == [] and scheduler.kv.outstanding_pages == 0
    assert scheduler.kv.pool.num_free_pages == 8


def test_a_sequence_finishes_with_length_after_max_new_steps() -> None:
    scheduler = make_scheduler()
    seq = make_seq("s", 2, max_new_steps=3)
    scheduler.add(seq)
    reasons = [step(scheduler)[1].finished.get(seq) for _ in range(3)]
    assert reasons == [None, None, FinishReason.LENGTH]
    assert seq.num_generated == 3 and seq.finish_reason is FinishReason.LENGTH
    assert scheduler.schedule().is_empty


def test_a_failed_sequence_finishes_with_error_and_frees_its_pages() -> None:
    scheduler = make_scheduler(num_pages=8)
    good, bad = make_seq("good", 3), make_seq("bad", 5)
    scheduler.add(good)
    scheduler.add(bad)
    batch = scheduler.schedule()
    result = StepResult(
        rows=[(good, [7]), (bad, [7])],  # a row for a failed sequence is ignored
        failed=[(bad, "RuntimeError: model exploded")],
    )
    outcome = scheduler.postprocess(batch, result)
    scheduler.check_integrity()
    assert outcome.failed == {bad: "RuntimeError: model exploded"}
    assert outcome.sampled == [good] and outcome.finished == {}
    assert bad.status is SequenceStatus.FINISHED and bad.finish_reason is FinishReason.ERROR
    assert bad.error == "RuntimeError: model exploded"
    assert bad.page_table == [] and bad.token_rows == [[100 + i] for i in range(5)]
    assert names(scheduler.running) == ["good"]
    assert good.num_computed_tokens == 3 and good.output_rows == [[7]]


def test_finishing_a_waiting_sequence_removes_it_from_the_queue() -> None:
    scheduler = make_scheduler(max_seqs=1)
    a, b = make_seq("a"), make_seq("b")
    scheduler.add(a)
    scheduler.add(b)
    step(scheduler)
    scheduler.finish(b, FinishReason.CANCELLED)
    scheduler.check_integrity()
    assert names(scheduler.waiting) == [] and b.finish_reason is FinishReason.CANCELLED


def test_a_delay_pattern_stream_learns_its_end_frame_and_ends_with_length() -> None:
    layout = DelayPatternLayout(num_codebooks=2, codebook_size=16, pad_id=16, eos_id=17)
    scheduler = make_scheduler(layout=layout)
    seq = make_seq("audio", rows=[[16, 16]], max_new_steps=3 + 1)
    seq.target_frames = 3
    scheduler.add(seq)
    ends = []
    for _ in range(4):
        _, outcome = step(scheduler, [3, 4])
        ends.append((seq.end_frame, outcome.finished.get(seq)))
    assert ends == [(None, None), (None, None), (3, None), (3, FinishReason.LENGTH)]


def test_a_delay_pattern_eos_fixes_the_end_frame_and_ends_with_eos() -> None:
    layout = DelayPatternLayout(num_codebooks=3, codebook_size=16, pad_id=16, eos_id=17)
    scheduler = make_scheduler(layout=layout)
    seq = make_seq("audio", rows=[[16, 16, 16]], max_new_steps=10 + 2)
    seq.target_frames = 10
    scheduler.add(seq)
    step(scheduler, [3, 16, 16])
    step(scheduler, [4, 3, 16])
    _, outcome = step(scheduler, [17, 4, 3])  # EOS on codebook 0 at step 2: two frames
    assert seq.end_frame == 2 and outcome.finished == {}
    _, outcome = step(scheduler, [16, 16, 4])  # the last codebook of the last frame
    assert outcome.finished == {seq: FinishReason.EOS}
    assert seq.end_frame == 2 and seq.num_generated == 4


def test_full_computed_pages_are_published_while_the_sequence_runs() -> None:
    scheduler = make_scheduler(budget=6)
    seq = make_seq("s", 10)
    scheduler.add(seq)
    step(scheduler)  # 6 computed: one full page
    assert len(seq.page_hashes) == 1
    assert scheduler.kv.pool.lookup(seq.page_hashes[0]) == seq.page_table[0]
    step(scheduler)  # 10 computed: two full pages
    assert len(seq.page_hashes) == 2


# -- random scripts -----------------------------------------------------------------------

STEMS = ([5] * 12, [5, 6] * 6, [6] * 12)  # shared beginnings: prefix hits happen often
step_op = st.tuples(st.just("step"), st.integers(0, 7), st.integers(0, 19))  # row id, who fails
operation = st.one_of(
    st.tuples(
        st.just("add"),
        st.sampled_from(STEMS),
        st.integers(0, 12),  # how much of the stem
        st.lists(st.integers(0, 2), max_size=4),  # then a few own tokens
        st.integers(1, 8),  # max_new_steps
    ),
    step_op,
    step_op,
    st.tuples(st.just("finish"), st.integers(0, 7)),
)


@settings(max_examples=60, deadline=None)
@given(
    ops=st.lists(operation, min_size=20, max_size=60),
    num_pages=st.integers(2, 6),
    budget=st.integers(4, 12),
    max_seqs=st.integers(1, 4),
    reserve=st.booleans(),
)
def test_random_scripts_keep_every_invariant(ops, num_pages, budget, max_seqs, reserve) -> None:
    scheduler = make_scheduler(
        num_pages, budget=budget, max_seqs=max_seqs, reserve=reserve, prefix_caching=True
    )
    live: list[Sequence] = []
    for index, op in enumerate(ops):
        if op[0] == "add":
            _, stem, stem_len, own, max_new = op
            tokens = [*stem[:stem_len], *own] or [0]
            seq = make_seq(f"r{index}", rows=[[t] for t in tokens], max_new_steps=max_new)
            seq.eos_ids = frozenset({3})
            if scheduler.kv.reservation(seq) <= num_pages:  # what Engine._submit enforces
                scheduler.add(seq)
                live.append(seq)
        elif op[0] == "step":
            _, row_id, fail_pick = op
            batch = scheduler.schedule()
            assert batch.num_tokens <= budget
            assert len(scheduler.running) <= max_seqs
            for seq, n in batch.items():
                assert seq.status is SequenceStatus.RUNNING
                assert n >= 1 and seq.num_computed_tokens + n <= seq.num_tokens
                assert len(seq.page_table) * PAGE >= seq.num_computed_tokens + n
            scheduler.check_integrity()  # between schedule and postprocess too
            items = batch.items()
            failed = [items[fail_pick][0]] if fail_pick < len(items) else []
            sampling = samplers(batch)
            result = StepResult(
                rows=[(seq, [row_id]) for seq in sampling if seq not in failed],
                failed=[(seq, "RuntimeError: boom") for seq in failed],
            )
            outcome = scheduler.postprocess(batch, result)
            for seq in (*outcome.finished, *outcome.failed):
                assert seq.status is SequenceStatus.FINISHED and seq.page_table == []
                live.remove(seq)
            for seq, reason in outcome.finished.items():
                assert reason in (FinishReason.EOS, FinishReason.LENGTH)
                assert seq.num_generated <= seq.max_new_steps
        elif live:
            seq = live.pop(op[1] % len(live))
            scheduler.finish(seq, FinishReason.CANCELLED)
        scheduler.check_integrity()
        assert set(live) == {*scheduler.running, *scheduler.waiting}
        assert all(seq.num_generated <= seq.max_new_steps for seq in live)
        if reserve:
            assert scheduler.num_preemptions == 0
    target(float(scheduler.num_preemptions), label="preemptions")  # steer toward full pools
    for seq in live:
        scheduler.finish(seq, FinishReason.CANCELLED)
    scheduler.check_integrity()
    assert scheduler.kv.pool.num_free_pages == num_pages
    assert scheduler.kv.outstanding_pages == 0


class _RestartingLayout(PlainLayout):
    """Every third row ends a context: the next one's prompt is five fresh rows."""

    max_context = 10
    context_rows_per_frame = 0.0

    def next_context(self, seq: Sequence) -> list[list[int]] | None:
        if seq.num_generated < 3:
            return None
        return [[200 + seq.num_preemptions + i] for i in range(5)]


def test_a_restarting_layout_s_context_starts_over_in_fresh_pages_within_its_reservation() -> None:
    scheduler = make_scheduler(layout=_RestartingLayout(), budget=6)
    seq = make_seq("a", prompt_len=6, max_new_steps=100)
    seq.max_context = _RestartingLayout.max_context
    scheduler.add(seq)
    reserved = None
    contexts = 0
    for _ in range(30):
        step(scheduler)
        if reserved is None:
            reserved = seq.reserved_pages
            assert reserved == -(-10 // PAGE)  # the context's pages, not 6 + 100 tokens'
        if seq.num_prompt_tokens == 5 and seq.num_computed_tokens == 0:
            contexts += 1
            assert seq.page_table == [] and seq.page_hashes == []
            assert seq.token_rows == [[200 + i] for i in range(5)]
        assert seq.reserved_pages == reserved
        scheduler.check_integrity()
    assert contexts >= 3 and seq.status is SequenceStatus.RUNNING
    scheduler.finish(seq, FinishReason.CANCELLED)
    scheduler.check_integrity()
    assert scheduler.kv.pool.num_free_pages == 32
