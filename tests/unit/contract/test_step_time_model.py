"""The step-time model: interpolation over measured points, the context term, the budget."""

from __future__ import annotations

import pytest

from cadenza.contract.calibration import CALIBRATION_ADAPTER, Calibration
from cadenza.contract.step_time_model import StepSample, StepTimeModel, step_budget_s

POINTS = [StepSample(1, 100, 4.0), StepSample(4, 400, 6.0), StepSample(8, 800, 10.0)]


def test_interpolates_between_measured_points_and_extrapolates_past_them() -> None:
    model = StepTimeModel.fit(POINTS)
    assert model.predict_ms(1, 100) == pytest.approx(4.0)
    assert model.predict_ms(8, 800) == pytest.approx(10.0)
    assert model.predict_ms(6, 600) == pytest.approx(8.0)  # half-way between 4 and 8
    # Past the last point: at least the last segment's slope (1 ms per stream).
    assert model.predict_ms(10, 1000) >= 12.0 - 1e-9


def test_noisy_points_never_predict_less_for_more_streams() -> None:
    noisy = [StepSample(1, 100, 4.0), StepSample(4, 400, 9.0), StepSample(8, 800, 7.0)]
    model = StepTimeModel.fit(noisy)
    predictions = [model.predict_ms(b, 100 * b) for b in range(1, 12)]
    assert predictions == sorted(predictions)


def test_without_a_long_context_point_attention_stays_in_the_points() -> None:
    # The sweep's context grows with its streams, so alone it cannot separate the two.
    assert StepTimeModel.fit(POINTS).per_kilocontext_ms == 0.0


def test_long_context_point_sets_the_attention_term() -> None:
    long = StepSample(4, 400 + 8000, 10.0)  # 4 ms more for 8,000 more positions
    model = StepTimeModel.fit(POINTS, long)
    assert model.per_kilocontext_ms == pytest.approx(0.5)
    assert model.predict_ms(4, 400 + 2000) == pytest.approx(7.0)


def test_max_batch_and_round_trip() -> None:
    model = StepTimeModel.fit(POINTS)
    assert model.max_batch(8.0, 100, 64) == 6
    assert model.max_batch(1.0, 100, 64) == 0
    assert model.max_batch(1000.0, 100, 5) == 5


def test_a_calibration_survives_its_json_round_trip() -> None:
    model = StepTimeModel.fit(POINTS, StepSample(4, 8400, 10.0))
    calibration = Calibration(model, tuple(POINTS), 0.25, "cpu x2", "abc", 1.5)
    again = CALIBRATION_ADAPTER.validate_json(CALIBRATION_ADAPTER.dump_json(calibration))
    assert again == calibration and again.model.predict_ms(5, 500) == model.predict_ms(5, 500)


def test_the_step_budget_is_one_frame_per_steps_per_frame_less_headroom() -> None:
    assert step_budget_s(0.08, 1, 0.1) == pytest.approx(0.072)
    assert step_budget_s(1 / 75, 1, 0.1) == pytest.approx(0.012)
    assert step_budget_s(2048 / 24000, 7, 0.0) == pytest.approx(2048 / 24000 / 7)


def test_fit_needs_samples() -> None:
    with pytest.raises(ValueError):
        StepTimeModel.fit([])


def test_attended_context_pads_decodes_unless_the_engine_reads_each_its_own() -> None:
    from cadenza.contract.step_time_model import attended_context

    assert attended_context([10, 30], [8]) == 2 * 30 + 8
    assert attended_context([10, 30], []) == 60
    assert attended_context([10, 30], [], decodes_padded=False) == 40
    assert attended_context([10, 30], [8], decodes_padded=False) == 40 + 8
    assert attended_context([], [], decodes_padded=False) == 0
