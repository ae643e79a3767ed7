"""Step telemetry: every non-empty step and delivered chunk, reported once, and the online
correction fed from the same records."""

from __future__ import annotations

import torch

from cadenza.contract.engine_stats import StepRecord
from cadenza.contract.sampling import SamplingParams
from cadenza.contract.step_time_model import StepTimeModel
from cadenza.engine.layouts.delay_pattern import DelayPatternLayout
from cadenza.engine.realtime.deadline_policy import DeadlinePolicy
from cadenza.engine.realtime.step_telemetry import MAX_RECORDS, StepTelemetry
from cadenza.engine.scheduler import ScheduledBatch
from cadenza.engine.sequence import Sequence


def _seq(tokens: int) -> Sequence:
    rows = [[1, 1]] * tokens
    return Sequence("s", rows, SamplingParams(), torch.Generator(), max_new_steps=10)


def test_steps_chunks_and_codec_time_are_reported_once() -> None:
    telemetry = StepTelemetry(policy=None)
    telemetry.record_step(ScheduledBatch(), 0.5)  # an empty step is not a step
    batch = ScheduledBatch(decodes=[_seq(10), _seq(30)], prefills=[(_seq(8), 8)])
    telemetry.record_step(batch, 0.004)
    telemetry.record_chunk(0.12)
    telemetry.record_codec(0.002, 15)
    # Decodes attend to every stream padded to the longest (2 x 30), the prefill its 8 rows.
    assert telemetry.last_step == StepRecord(0.004, 2, 10, 2 * 30 + 8)
    report = telemetry.take_report()
    assert report.steps == (StepRecord(0.004, 2, 10, 68),)
    assert (report.chunk_slack_s, report.codec_s, report.codec_frames) == ((0.12,), 0.002, 15)
    empty = telemetry.take_report()
    assert (empty.steps, empty.chunk_slack_s, empty.codec_frames) == ((), (), 0)


def test_an_engine_that_does_not_pad_records_the_sum_of_its_decodes_contexts() -> None:
    telemetry = StepTelemetry(policy=None, decodes_padded=False)
    telemetry.record_step(ScheduledBatch(decodes=[_seq(10), _seq(30)]), 0.004)
    assert telemetry.last_step == StepRecord(0.004, 2, 2, 10 + 30)
    mixed = ScheduledBatch(decodes=[_seq(10), _seq(30)], prefills=[(_seq(8), 8)])
    telemetry.record_step(mixed, 0.004)
    assert telemetry.last_step == StepRecord(0.004, 2, 10, 10 + 30 + 8)


def test_records_are_bounded_when_nobody_drains_them() -> None:
    telemetry = StepTelemetry(policy=None)
    for _ in range(MAX_RECORDS + 10):
        telemetry.record_chunk(0.1)
    assert len(telemetry.take_report().chunk_slack_s) == MAX_RECORDS


def test_decode_steps_correct_the_calibrated_model() -> None:
    layout = DelayPatternLayout(num_codebooks=2, codebook_size=16, pad_id=16, eos_id=17)
    policy = DeadlinePolicy(
        layout,
        frame_period_s=1 / 75,
        first_chunk_frames=8,
        chunk_frames=15,
        headroom=0.1,
        min_prefill_tokens=16,
    )
    policy.step_model = StepTimeModel(0.0, 1.0, 0.0, ((1, 10, 1.0), (8, 80, 8.0)))
    telemetry = StepTelemetry(policy)
    batch = ScheduledBatch(decodes=[_seq(10), _seq(10)])
    telemetry.record_step(batch, 0.004)  # 4 ms where 2 ms were predicted
    assert abs(policy.correction.factor - 2.0) < 1e-6


def test_a_steps_codec_time_is_recorded_with_it() -> None:
    telemetry = StepTelemetry(policy=None)
    telemetry.record_codec(0.003, 8)  # within the step being run
    telemetry.record_step(ScheduledBatch(decodes=[_seq(10)]), 0.005)
    assert telemetry.last_step is not None and telemetry.last_step.codec_s == 0.003
    telemetry.record_step(ScheduledBatch(decodes=[_seq(11)]), 0.002)
    assert telemetry.last_step.codec_s == 0.0
    assert telemetry.take_report().codec_s == 0.003
