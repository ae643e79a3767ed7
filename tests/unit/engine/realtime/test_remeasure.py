"""An engine on a conservative calibration measures again when idle: a request arriving stops
the sweep at once and leaves the engine as it was; a sweep that agrees replaces it."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from cadenza.config import CalibrationConfig
from cadenza.contract.calibration import Calibration
from cadenza.engine.engine import Engine
from cadenza.engine.realtime import remeasure as remeasure_module
from cadenza.engine.realtime.calibration_cache import cache_path, calibration_identity
from cadenza.engine.realtime.remeasure import (
    MAX_BACKOFF,
    RemeasureSchedule,
    remeasure,
    wants_remeasure,
)
from tests.support.contract_examples import engine_info


def _engine(cache: Path) -> Engine:
    """A small sweep, its checks lenient (a short sweep on a machine running tests is noisy;
    the checks have tests of their own)."""
    calibration = CalibrationConfig(
        batch_sizes=(1, 2),
        duration_ms=200.0,
        long_context_tokens=0,
        cache_dir=str(cache),
        tolerance=100.0,
    )
    return Engine.from_pretrained(
        "cadenza-tiny", calibration=calibration, kv_cache_memory_bytes=32 << 20
    )


def _conservative(engine: Engine) -> Calibration:
    """A calibration that contradicted itself, as the engine serves it."""
    example = engine_info().calibration
    assert example is not None
    return dataclasses.replace(
        example,
        identity=calibration_identity(engine, 0),
        attempts=1,
        problems=("attempt 1: the engine had 40% of its cores' time while measuring 2 streams",),
    )


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Engine:
    return _engine(tmp_path_factory.mktemp("calibrations"))


def test_only_a_conservative_calibration_is_measured_again(engine: Engine) -> None:
    kept = _conservative(engine)
    engine.apply_calibration(kept)
    assert wants_remeasure(engine)
    engine.apply_calibration(dataclasses.replace(kept, problems=()))
    assert not wants_remeasure(engine)
    engine.apply_calibration(None)
    assert not wants_remeasure(engine)


def test_a_request_arriving_stops_the_sweep_and_leaves_the_engine_as_it_was(
    engine: Engine,
) -> None:
    kept = _conservative(engine)
    engine.apply_calibration(kept)
    asked: list[int] = []

    def interrupted() -> bool:
        asked.append(len(asked))
        return len(asked) > 5  # something arrives during the sweep's first point

    result = remeasure(engine, interrupted)
    assert result.outcome == "interrupted" and result.calibration == kept
    assert len(asked) == 6  # stopped at once, and not asked again while cleaning up
    assert engine.calibration == kept and engine.policy is not None
    assert engine.policy.step_model == kept.model
    assert "step" not in vars(engine)  # the engine steps as ever
    assert not engine.has_unfinished_requests() and engine.take_report().steps == ()
    engine.check_integrity()
    assert engine.kv.pool.num_free_pages == engine.kv.pool.num_pages
    assert not cache_path(engine, kept.identity).exists()


def test_a_sweep_that_still_disagrees_is_dropped(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    kept = _conservative(engine)
    engine.apply_calibration(kept)
    busy = dataclasses.replace(kept, problems=("2 streams measured 1.00 and 3.00 ms a step",))
    monkeypatch.setattr(remeasure_module, "run_sweep", lambda engine, identity: busy)
    result = remeasure(engine, lambda: False)
    assert result.outcome == "disagreed" and engine.calibration == kept
    assert not cache_path(engine, kept.identity).exists()


def test_a_sweep_that_agrees_replaces_the_calibration_and_is_cached(engine: Engine) -> None:
    kept = _conservative(engine)
    engine.apply_calibration(kept)
    result = remeasure(engine, lambda: False)
    assert result.outcome == "agreed"
    adopted = result.calibration
    assert adopted.consistent and adopted.identity == kept.identity
    assert adopted.attempts == 2 and adopted.source == "measured"
    assert [p[0] for p in adopted.model.decode_points] == [1, 2]
    assert engine.calibration == adopted and engine.info.calibration == adopted
    assert engine.policy is not None and engine.policy.step_model == adopted.model
    assert cache_path(engine, kept.identity).is_file()  # the next start reads it
    assert not engine.has_unfinished_requests()
    engine.check_integrity()


def test_the_wait_doubles_while_sweeps_disagree() -> None:
    schedule = RemeasureSchedule(30.0)
    assert not schedule.due(29.0) and schedule.due(30.0)
    schedule.ended("interrupted")  # traffic: the next idle spell, as long
    assert schedule.due(30.0)
    for _ in range(10):
        schedule.ended("disagreed")
    assert schedule.wait_s == MAX_BACKOFF * 30.0 and not schedule.due(479.0)
    schedule.ended("agreed")
    assert schedule.wait_s == 30.0
    assert not RemeasureSchedule(0.0).due(1e9)  # 0: never
