"""Waves of simultaneous arrivals measured on the real engine."""

from __future__ import annotations

from pathlib import Path

from cadenza.engine.realtime.arrival_waves import measure_wave, measure_waves, wave_sizes
from cadenza.engine.realtime.calibration import run_sweep
from tests.unit.engine.realtime.test_calibration import _engine


def test_waves_are_measured_at_the_batches_in_budget_and_the_first_past_it() -> None:
    points = ((1, 40, 2.0), (2, 80, 3.0), (4, 160, 11.0), (8, 320, 14.0), (16, 640, 30.0))
    assert wave_sizes(points, 12.0) == [1, 2, 4, 8]
    assert wave_sizes(points, 1.0) == [1]
    assert wave_sizes(points, 100.0) == [1, 2, 4, 8, 16]


def test_a_wave_follows_every_stream_past_its_first_chunks_and_leaves_the_engine_idle(
    tmp_path: Path,
) -> None:
    engine = _engine(tmp_path)
    point = measure_wave(engine, 3)
    assert point.streams == 3 and point.max_factor > 0 and point.span_s > 0
    assert not engine.has_unfinished_requests()
    engine.check_integrity()
    assert engine.kv.pool.num_free_pages == engine.kv.pool.num_pages
    # Measured twice, the lower factor kept; the engine's own calibration is as it was.
    calibration = run_sweep(engine)
    engine.apply_calibration(None)
    waves = measure_waves(engine, calibration, budget_ms=1e9)
    assert [w.streams for w in waves] == [1, 2]
    assert engine.calibration is None and not engine.has_unfinished_requests()
