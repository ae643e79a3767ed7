"""The checks that keep a calibration taken on a busy machine from being cached: repeated
points, order, slopes; and the conservative calibration served when no sweep passes."""

from __future__ import annotations

from dataclasses import replace

import pytest

from cadenza.contract.calibration import Calibration, StepRepeat
from cadenza.contract.step_time_model import StepSample, StepTimeModel
from cadenza.engine.realtime.calibration_checks import (
    CONSERVATIVE_JITTER,
    calibration_problems,
    conservative,
)

# Measured on the 2-core development machine (one replica of two): a quiet sweep.
QUIET = [(1, 2.12), (2, 2.60), (4, 3.52), (8, 5.30), (12, 7.59), (16, 9.48), (20, 12.54)]


def sweep(points: list[tuple[int, float]], repeats: dict[int, float] | None = None) -> Calibration:
    samples = [StepSample(t, 40 * t, ms) for t, ms in points]
    again = repeats or {}
    return Calibration(
        model=StepTimeModel.fit(samples),
        samples=tuple(samples),
        codec_ms_per_frame=0.4,
        device_name="cpu",
        identity="x",
        measured_s=1.0,
        repeats=tuple(StepRepeat(s.tokens, s.context_tokens, s.ms, again.get(s.tokens, s.ms))
                      for s in samples),
    )  # fmt: skip


def test_a_quiet_sweep_has_no_problems() -> None:
    assert calibration_problems(sweep(QUIET), 0.35) == []


def test_repeats_that_disagree_mean_a_busy_machine() -> None:
    noisy = sweep(QUIET, repeats={8: 5.30 * 1.6})
    (problem,) = calibration_problems(noisy, 0.35)
    assert "8 streams" in problem and "60%" in problem
    assert calibration_problems(noisy, 1.0) == []  # within a looser tolerance


def test_a_point_measured_while_the_cores_were_taken_shows_as_a_steep_segment() -> None:
    # the issue's case: the largest point slow, the model's slope past it 10x the others'
    busy = [*QUIET[:-1], (20, 60.0)]
    problems = calibration_problems(sweep(busy), 0.35)
    assert any("up to 20 streams" in p for p in problems)
    faster = [*QUIET[:3], (8, 2.0), *QUIET[4:]]  # 8 streams faster than 4
    assert any("ran faster than" in p for p in calibration_problems(sweep(faster), 0.35))


def test_the_conservative_calibration_takes_every_point_at_its_fastest() -> None:
    first = replace(sweep([*QUIET[:-1], (20, 60.0)]), problems=("a",))
    second = replace(sweep([(t, ms * 1.3) for t, ms in QUIET]), problems=("b",))
    combined = conservative([first, second])
    assert [ms for _, _, ms in combined.model.decode_points] == pytest.approx(
        [ms for _, ms in QUIET[:-1]] + [12.54 * 1.3]
    )
    assert combined.jitter == CONSERVATIVE_JITTER and combined.attempts == 2
    assert combined.problems == ("attempt 1: a", "attempt 2: b")
    assert not combined.consistent
    with pytest.raises(ValueError):
        conservative([])


def test_a_busy_loop_on_the_engine_s_core_shows_in_its_share_of_the_core() -> None:
    # every point alike twice as slow: the repeats agree and the slopes are smooth, but the
    # engine had half of its core while it measured
    uniform = sweep([(t, 2 * ms) for t, ms in QUIET])
    assert calibration_problems(uniform, 0.5) == []
    halved = replace(uniform, repeats=tuple(replace(r, cpu_share=0.52) for r in uniform.repeats))
    problems = calibration_problems(halved, 0.5)
    assert len(problems) == len(QUIET) and "52% of its cores' time" in problems[0]
