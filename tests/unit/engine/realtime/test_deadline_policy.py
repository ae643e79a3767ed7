"""Deadline scheduling: playout clocks, earliest-deadline-first order, skipping streams that are
ahead, prefill chunks sized to the most urgent stream."""

from __future__ import annotations

import pytest
import torch

from cadenza.contract.sampling import SamplingParams
from cadenza.contract.step_time_model import StepSample, StepTimeModel
from cadenza.engine.layouts.delay_pattern import DelayPatternLayout
from cadenza.engine.realtime.deadline_policy import DeadlinePolicy
from cadenza.engine.realtime.playout_clock import PlayoutClock
from cadenza.engine.sequence import AudioProgress, Sequence

FRAME_S = 1 / 75


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _policy(clock: FakeClock, model: StepTimeModel | None) -> DeadlinePolicy:
    policy = DeadlinePolicy(
        DelayPatternLayout(num_codebooks=2, codebook_size=16, pad_id=16, eos_id=17),
        frame_period_s=FRAME_S,
        first_chunk_frames=4,
        chunk_frames=8,
        headroom=0.1,
        min_prefill_tokens=16,
        clock=clock,
    )
    policy.step_model = model
    return policy


def _stream(clock: FakeClock, frames_sent: int, generated: int, ahead_s: float) -> Sequence:
    """A decoding stream whose next chunk is due ``ahead_s`` from now."""
    seq = Sequence("s", [[16, 16]], SamplingParams(), torch.Generator(), max_new_steps=10_000)
    seq.token_rows += [[1, 1]] * generated
    seq.num_computed_tokens = seq.num_tokens - 1
    seq.target_frames = 1000
    playout = PlayoutClock(clock.now, 0.3, FRAME_S, reserve_s=0.1)
    playout.playout_start_s = clock.now + ahead_s - frames_sent * FRAME_S
    seq.audio = AudioProgress(playout, codec_slot=0, frames_sent=frames_sent)
    return seq


def test_playout_clock_deadlines_and_slack() -> None:
    clock = PlayoutClock(arrival_s=10.0, ttfa_target_s=0.3, frame_period_s=0.02, reserve_s=0.1)
    assert clock.due_s(0) == pytest.approx(10.3)  # the first chunk
    assert clock.delivered(0, now_s=10.2) == pytest.approx(0.1)  # on time, 100 ms early
    assert clock.playout_start_s == pytest.approx(10.3)  # playing starts one reserve later
    assert clock.due_s(5) == pytest.approx(10.4)
    assert clock.delivered(5, now_s=10.45) == pytest.approx(-0.05)  # 50 ms late


def test_streams_are_ordered_by_laxity() -> None:
    clock = FakeClock()
    policy = _policy(clock, None)
    late = _stream(clock, 8, 20, ahead_s=0.05)
    early = _stream(clock, 8, 20, ahead_s=2.0)
    middle = _stream(clock, 8, 20, ahead_s=0.5)
    kept, skipped = policy.order_and_skip([early, late, middle])
    assert kept == [late, middle, early]
    assert skipped == []  # no step model: no skipping


def test_over_budget_steps_skip_only_streams_ahead_of_their_reserve() -> None:
    clock = FakeClock()
    # 1 ms per stream: 12 streams = 12 ms, over the 12 ms budget (13.3 ms * 0.9) by a hair.
    model = StepTimeModel.fit([StepSample(1, 20, 1.0), StepSample(20, 400, 20.0)])
    policy = _policy(clock, model)
    behind = [_stream(clock, 8, 20, ahead_s=0.05) for _ in range(10)]
    ahead = [_stream(clock, 8, 20, ahead_s=3.0) for _ in range(4)]
    kept, skipped = policy.order_and_skip(behind + ahead)
    assert set(skipped) <= set(ahead) and skipped
    assert all(seq in kept for seq in behind)
    predicted = policy.predict_s(len(kept), sum(s.num_tokens for s in kept))
    assert predicted is not None and predicted <= policy.step_budget_s
    # Within budget nobody skips, however far ahead.
    kept, skipped = policy.order_and_skip(ahead)
    assert skipped == []


def test_a_stream_about_to_eat_into_its_reserve_gets_short_steps() -> None:
    clock = FakeClock()
    model = StepTimeModel.fit([StepSample(1, 20, 1.0), StepSample(20, 400, 20.0)])
    policy = _policy(clock, model)
    urgent = _stream(clock, 8, 20, ahead_s=0.05)  # 50 ms: inside its 100 ms reserve
    near = _stream(clock, 8, 20, ahead_s=0.3)
    far = [_stream(clock, 8, 20, ahead_s=2.0) for _ in range(4)]
    kept, skipped = policy.order_and_skip([*far, near, urgent])
    assert kept == [urgent, near] and set(skipped) == set(far)  # within budget, yet focused
    kept, skipped = policy.order_and_skip([*far, near])  # nobody urgent: everyone steps
    assert skipped == [] and len(kept) == 5


def test_prefill_is_capped_by_the_most_urgent_stream() -> None:
    clock = FakeClock()
    samples = [StepSample(1, 20, 1.0), StepSample(20, 400, 20.0)]
    model = StepTimeModel.fit(samples, prefill_ms_per_token=0.01)
    policy = _policy(clock, model)
    relaxed = [_stream(clock, 8, 20, ahead_s=5.0)]
    assert policy.prefill_limit(relaxed, 512) == 512
    urgent = [_stream(clock, 8, 20, ahead_s=0.003)]
    limit = policy.prefill_limit(urgent, 512)
    assert 16 <= limit < 512
    assert policy.prefill_limit([], 512) == 512  # nobody decoding: the whole budget
    late = [_stream(clock, 8, 20, ahead_s=-1.0)]
    assert policy.prefill_limit(late, 512) == 16  # always some progress


def test_prefill_borrows_past_the_budget_only_what_every_stream_can_spare() -> None:
    clock = FakeClock()
    samples = [StepSample(1, 20, 1.0), StepSample(20, 400, 20.0)]
    policy = _policy(clock, StepTimeModel.fit(samples, prefill_ms_per_token=1.0))
    # Budget 12 ms (13.3 ms less 10 %), one stream's step 1 ms: 11 ms of prompt rows at 1 ms.
    near = [_stream(clock, 8, 20, ahead_s=0.105)]  # 5 ms beyond its 100 ms reserve
    assert policy.prefill_limit(near, 512) == 16  # the budget's 11 rows, raised to the minimum
    # A stream 200 ms ahead lends what it has beyond its reserve: 100 ms, 100 rows.
    ahead = [_stream(clock, 8, 20, ahead_s=0.2)]
    assert 98 <= policy.prefill_limit(ahead, 512) <= 100
    # The least lax stream decides: one near its reserve keeps a busy step within budget.
    busy = [_stream(clock, 8, 20, ahead_s=5.0) for _ in range(11)]
    assert policy.prefill_limit(busy, 512) == 512  # all far ahead: the whole token budget
    assert policy.prefill_limit([*busy, *near], 512) == 16
    assert policy.spare_lead_s(busy) == pytest.approx(4.9, abs=0.02)
    assert policy.spare_lead_s([*busy, *near]) == pytest.approx(0.005, abs=0.002)
    assert policy.spare_lead_s([_stream(clock, 8, 20, ahead_s=0.05)]) == 0.0  # never negative
    assert policy.spare_lead_s([]) is None
    # A stream still waiting for its first chunk lends nothing to admission's view (it is
    # about to have a lead of its own), but the step still protects its first chunk.
    young = _stream(clock, 0, 20, ahead_s=0.105)
    assert policy.spare_lead_s([young]) is None
    assert policy.spare_lead_s([*busy, young]) == pytest.approx(4.9, abs=0.02)
    assert policy.prefill_limit([*busy, young], 512) == 16
    assert _policy(clock, None).spare_lead_s(busy) == pytest.approx(4.9, abs=0.02)


def test_streams_far_ahead_of_their_listeners_let_the_engine_wait() -> None:
    clock = FakeClock()
    policy = _policy(clock, StepTimeModel.fit([StepSample(1, 20, 1.0), StepSample(20, 400, 20.0)]))
    assert policy.idle_s([_stream(clock, 8, 20, ahead_s=5.0)]) == 0.0  # no lead cap: never
    policy.max_lead_s = 1.5
    ahead = [_stream(clock, 8, 20, ahead_s=5.0), _stream(clock, 8, 20, ahead_s=3.0)]
    assert policy.idle_s(ahead) == pytest.approx(1.5, abs=0.01)  # the least ahead decides
    assert policy.idle_s([*ahead, _stream(clock, 8, 20, ahead_s=1.0)]) == 0.0
    prefilling = _stream(clock, 8, 20, ahead_s=5.0)
    prefilling.num_computed_tokens = 3  # 18 rows still lack KV
    assert policy.idle_s([*ahead, prefilling]) == 0.0  # a prompt in progress: step now
    assert policy.idle_s([]) == 0.0


def test_the_engine_rests_until_the_hysteresis_then_steps_back_to_back() -> None:
    clock = FakeClock()
    policy = _policy(clock, StepTimeModel.fit([StepSample(1, 20, 1.0), StepSample(20, 400, 20.0)]))
    policy.max_lead_s, policy.lead_hysteresis_s = 1.5, 0.3

    def idle(ahead_s: float) -> float:
        return policy.idle_s([_stream(clock, 8, 20, ahead_s=ahead_s)])

    assert idle(1.4) == 0.0  # under the cap, not resting: step
    assert idle(2.0) == pytest.approx(0.8, abs=0.01)  # past the cap: rest down to 1.2 s
    assert idle(1.4) == pytest.approx(0.2, abs=0.01)  # still resting below the cap
    assert idle(1.19) == 0.0  # rested enough: steps back to back ...
    assert idle(1.45) == 0.0  # ... up to the cap again
    assert idle(1.55) == pytest.approx(0.35, abs=0.01)
    prefilling = _stream(clock, 8, 20, ahead_s=5.0)
    prefilling.num_computed_tokens = 3
    assert policy.idle_s([prefilling]) == 0.0  # a prompt ends the rest
    assert idle(1.4) == 0.0


def test_later_rows_of_a_long_prompt_get_fewer_rows_a_step() -> None:
    clock = FakeClock()
    samples = [StepSample(1, 20, 1.0), StepSample(20, 400, 20.0)]
    model = StepTimeModel.fit(samples, prefill_ms_per_token=0.05, prefill_ms_per_row_position=1e-4)
    policy = _policy(clock, model)
    near = [_stream(clock, 8, 20, ahead_s=0.105)]  # the step budget's 11 ms, nothing lent
    start = policy.prefill_limit(near, 512)
    later = policy.prefill_limit(near, 512, context_before=2000)
    assert 16 < later < start < 512
    assert model.prefill_ms(start) <= 11.0 < model.prefill_ms(start + 1)
    assert model.prefill_ms(later, 2000) <= 11.0 < model.prefill_ms(later + 1, 2000)
