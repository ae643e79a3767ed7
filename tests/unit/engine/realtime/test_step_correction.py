"""The online correction of the calibrated step-time model."""

from __future__ import annotations

import math

import pytest

from cadenza.contract.step_time_model import StepSample, StepTimeModel
from cadenza.engine.realtime.step_correction import OnlineCorrection

POINTS = [StepSample(1, 100, 4.0), StepSample(4, 400, 6.0), StepSample(8, 800, 10.0)]


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
