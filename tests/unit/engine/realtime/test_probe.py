"""A probe on the real engine: synthetic streams decoded while idle, every step reported
apart, and the engine idle again afterwards with every page free."""

from __future__ import annotations

import pytest

from cadenza.config import EngineConfig, load_config
from cadenza.contract.calibration import Calibration
from cadenza.contract.request import SynthesisRequest
from cadenza.contract.step_time_model import StepSample, StepTimeModel
from cadenza.engine.engine import Engine
from cadenza.engine.naive_engine import NaiveEngine
from cadenza.engine.realtime.probe import probe_engine

MODEL = StepTimeModel(2.0, 0.5, 0.0, ((1, 40, 2.5), (8, 320, 6.0)))


@pytest.fixture(scope="module")
def engine() -> Engine:
    engine = Engine.from_pretrained(
        "cadenza-tiny", engine_config=EngineConfig(kv_cache_memory_bytes=32 << 20)
    )
    samples = (StepSample(1, 40, 2.5), StepSample(8, 320, 6.0))
    engine.apply_calibration(Calibration(MODEL, samples, 0.3, "cpu", "probe-test", 1.0))
    return engine


def _idle_afterwards(engine: Engine) -> None:
    assert not engine.has_unfinished_requests()
    engine.check_integrity()
    used = engine.kv.pool.num_pages - engine.kv.pool.num_free_pages
    assert used == 0


def test_a_probe_decodes_its_batch_and_reports_every_step(engine: Engine) -> None:
    engine.take_report()
    result = probe_engine(engine, 4, max_ms=10_000, interrupted=lambda: False)
    assert result.outcome == "done" and result.batch == 4
    decodes = [s for s in result.report.steps if s.decodes == 4 and s.tokens == 4]
    plan = engine.realtime_plan
    assert len(decodes) >= plan.chunk_frames  # a chunk period of pure decoding at least
    assert result.report.codec_frames > 0
    assert engine.take_report().steps == ()  # nothing left over for the next stats
    _idle_afterwards(engine)


def test_a_probe_stops_as_soon_as_something_arrives(engine: Engine) -> None:
    polls: list[int] = []

    def arrives_on_the_third_look() -> bool:
        polls.append(1)
        return len(polls) >= 3

    result = probe_engine(engine, 4, max_ms=10_000, interrupted=arrives_on_the_third_look)
    assert result.outcome == "interrupted" and len(result.report.steps) == 2
    _idle_afterwards(engine)


def test_a_probe_stops_when_its_time_is_up(engine: Engine) -> None:
    result = probe_engine(engine, 4, max_ms=1e-3, interrupted=lambda: False)
    assert result.outcome == "timed_out"
    _idle_afterwards(engine)


def test_a_busy_engine_runs_no_probe(engine: Engine) -> None:
    engine.add_request(SynthesisRequest("live", "hello", max_duration_s=0.2))
    try:
        result = probe_engine(engine, 4, max_ms=10_000, interrupted=lambda: False)
        assert result.outcome == "busy" and result.batch == 0 and result.report.steps == ()
        assert engine.sequence("live") is not None  # the stream is untouched
    finally:
        engine.abort_request("live")
        engine.step()
    _idle_afterwards(engine)


def test_a_probe_fits_its_batch_to_the_pages_and_slots_it_has() -> None:
    small = Engine.from_pretrained(
        "cadenza-tiny", engine_config=EngineConfig(kv_cache_memory_bytes=4 << 20, max_num_seqs=3)
    )
    small.apply_calibration(Calibration(MODEL, (StepSample(1, 40, 2.5),), 0.3, "cpu", "x", 1.0))
    result = probe_engine(small, 64, max_ms=10_000, interrupted=lambda: False)
    assert result.outcome == "done" and 1 <= result.batch <= 3
    _idle_afterwards(small)
    uncalibrated = Engine.from_pretrained(
        "cadenza-tiny", engine_config=EngineConfig(kv_cache_memory_bytes=4 << 20)
    )
    assert probe_engine(uncalibrated, 4, 100.0, lambda: False).outcome == "unsupported"


def test_the_naive_baseline_has_nothing_to_probe() -> None:
    """Only the batching engine runs probes: the baseline admits by memory and slots."""
    naive = NaiveEngine.from_config(load_config(overrides={"engine": {"kind": "naive"}}))
    assert probe_engine(naive, 4, 100.0, lambda: False).outcome == "unsupported"
