"""The step-time model: interpolation over measured points, the context term, the budget."""

from __future__ import annotations

import numpy as np
import pytest

from cadenza.contract.calibration import CALIBRATION_ADAPTER, Calibration
from cadenza.contract.step_time_model import (
    StepSample,
    StepTimeModel,
    nonnegative_least_squares,
    step_budget_s,
)

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


def test_a_prompt_row_costs_its_layers_and_every_position_it_reads() -> None:
    model = StepTimeModel(
        fixed_ms=1.0,
        per_token_ms=0.5,
        per_kilocontext_ms=0.0,
        prefill_ms_per_token=0.1,
        prefill_ms_per_row_position=0.001,
    )
    # 4 rows from position 0 read 1 + 2 + 3 + 4 = 10 positions.
    assert model.prefill_ms(4) == pytest.approx(0.4 + 0.01)
    # The same rows after 100 cached positions read 410.
    assert model.prefill_ms(4, context_before=100) == pytest.approx(0.4 + 0.41)
    # A prompt prefilled in two chunks costs what it costs in one.
    assert model.prefill_ms(300) + model.prefill_ms(200, 300) == pytest.approx(
        model.prefill_ms(500)
    )
    assert model.prefill_ms(0) == 0.0 and model.prefill_ms(-3) == 0.0


def test_prefill_rows_within_is_the_most_rows_that_fit() -> None:
    quadratic = StepTimeModel(
        1.0, 0.5, 0.0, prefill_ms_per_token=0.1, prefill_ms_per_row_position=1e-3
    )
    flat = StepTimeModel(1.0, 0.5, 0.0, prefill_ms_per_token=0.1)
    for model in (quadratic, flat):
        for budget in (0.05, 1.0, 7.5, 40.0):
            for before in (0, 37, 900):
                rows = model.prefill_rows_within(budget, before)
                assert model.prefill_ms(rows, before) <= budget + 1e-12
                assert model.prefill_ms(rows + 1, before) > budget
    assert quadratic.prefill_rows_within(40.0, 900) < quadratic.prefill_rows_within(40.0, 0)
    assert flat.prefill_rows_within(40.05, 900) == flat.prefill_rows_within(40.05, 0) == 400
    assert quadratic.prefill_rows_within(0.0) == 0 and quadratic.prefill_rows_within(-1.0) == 0


def test_nonnegative_least_squares_drops_a_negative_coefficient_and_refits() -> None:
    rows = np.array([1.0, 2.0, 4.0, 8.0])
    exact = nonnegative_least_squares([np.ones(4), rows], 0.5 + 2.0 * rows)
    assert exact == pytest.approx([0.5, 2.0])
    # A target that falls with rows would need a negative slope: 0, and the mean for the rest.
    falling = nonnegative_least_squares([np.ones(4), rows], np.array([4.0, 3.0, 2.0, 1.0]))
    assert falling == pytest.approx([2.5, 0.0])
