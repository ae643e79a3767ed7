"""The step-time model: interpolation over measured points, the context term, the online
correction."""

from __future__ import annotations

import math

import pytest

from cadenza.engine.step_time_model import OnlineCorrection, StepSample, StepTimeModel

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
    assert StepTimeModel.from_dict(model.to_dict()) == model


def test_fit_needs_samples() -> None:
    with pytest.raises(ValueError):
        StepTimeModel.fit([])


def test_online_correction_is_a_ratio_of_sums_over_decode_steps() -> None:
    model = StepTimeModel.fit(POINTS)
    correction = OnlineCorrection(window=4)
    assert correction.factor == 1.0
    correction.observe(model, 4, 4, 400, 12.0)  # twice the prediction
    correction.observe(model, 4, 4, 400, 6.0)  # as predicted
    assert correction.factor == pytest.approx(1.5)
    correction.observe(model, 64, 4, 400, 1000.0)  # a prefill-dominated step: ignored
    correction.observe(model, 0, 0, 0, 1000.0)  # no decodes: ignored
    correction.observe(model, 4, 4, 400, math.nan)
    assert correction.factor == pytest.approx(1.5)
    for _ in range(4):  # the window forgets old steps
        correction.observe(model, 4, 4, 400, 3.0)
    assert correction.factor == pytest.approx(0.5)
    for _ in range(4):
        correction.observe(model, 4, 4, 400, 600.0)
    assert correction.factor == correction.max_factor


def test_online_correction_forgets_steps_older_than_its_horizon():
    model = StepTimeModel.fit(POINTS)
    correction = OnlineCorrection(window=100, max_age_s=30.0)
    for second in range(10):
        correction.observe(model, 4, 4, 400, 12.0, now=float(second))  # twice as slow
    assert correction.factor_at(10.0) == pytest.approx(2.0)
    assert correction.factor_at(35.0) == pytest.approx(2.0)  # the last 5 are recent enough
    assert correction.factor_at(45.0) == 1.0  # idle for long: back to the calibration
    assert correction.samples == 0
