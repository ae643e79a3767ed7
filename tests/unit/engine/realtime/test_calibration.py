"""Start-up calibration on the real engine: a small sweep, its cache, and the engine left idle."""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path
from types import SimpleNamespace

import pytest

from cadenza.config import CalibrationConfig, RealtimeConfig, load_config
from cadenza.contract.calibration import CALIBRATION_ADAPTER, Calibration, StepRepeat
from cadenza.contract.request import SynthesisRequest
from cadenza.engine.engine import Engine
from cadenza.engine.realtime import calibration as calibration_module
from cadenza.engine.realtime.calibration import (
    _measure_prefill,
    load_or_calibrate,
    warm_up,
)
from cadenza.engine.realtime.calibration_cache import calibration_identity, read_cache
from cadenza.engine.realtime.synthetic_streams import SHORT_PROMPT_CHARS
from cadenza.kernels.native import loader
from tests.support.contract_examples import engine_info


def _engine(
    cache: Path,
    *,
    realtime: RealtimeConfig | None = None,
    max_num_batched_tokens: int | None = None,
    **overrides: object,
) -> Engine:
    """A small sweep (``overrides``: its ``[calibration]`` keys); its consistency checks off
    unless asked for (a short sweep on a machine running the test suite is noisy: the checks
    have tests of their own, with noise injected)."""
    calibration = CalibrationConfig(
        **{
            "batch_sizes": (1, 2),
            "duration_ms": 200.0,
            "long_context_tokens": 64,
            "cache_dir": str(cache),
            "tolerance": 100.0,
            **overrides,
        }  # type: ignore[arg-type]
    )
    return Engine.from_pretrained(
        "cadenza-tiny",
        calibration=calibration,
        realtime=realtime,
        max_num_batched_tokens=max_num_batched_tokens,
        kv_cache_memory_bytes=32 << 20,
    )


def test_sweep_fits_a_model_caches_it_and_leaves_the_engine_idle(tmp_path: Path) -> None:
    engine = _engine(tmp_path)
    calibration = load_or_calibrate(engine)
    assert calibration is not None and calibration.source == "measured"
    assert [p[0] for p in calibration.model.decode_points] == [1, 2]
    assert len(calibration.samples) == 3  # two batch sizes and the long-context point
    assert all(s.ms > 0 for s in calibration.samples)
    assert calibration.codec_ms_per_frame > 0
    # Waves of simultaneous arrivals: at the sizes the sweep measured (those in budget and
    # the first past it), each its factor and span.
    sizes = [w.streams for w in calibration.waves]
    assert sizes and set(sizes) <= {1, 2} and sizes == sorted(sizes)
    assert all(w.max_factor > 0 and w.span_s > 0 for w in calibration.waves)
    assert not engine.has_unfinished_requests()
    assert engine.take_report().steps == ()  # the sweep's own steps are not reported
    engine.check_integrity()
    assert engine.kv.pool.num_free_pages == engine.kv.pool.num_pages
    engine.apply_calibration(calibration)
    assert engine.policy is not None and engine.policy.step_model == calibration.model
    assert engine.info.calibration == calibration

    cached = next(tmp_path.glob("calibration-*.json")).read_bytes()
    assert json.loads(cached)["model"]["decode_points"]
    assert CALIBRATION_ADAPTER.validate_json(cached).model == calibration.model
    again = load_or_calibrate(_engine(tmp_path))
    assert again is not None and again.source == "cache" and again.model == calibration.model


def test_the_long_context_point_keeps_the_slower_of_two_measurements(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = _engine(tmp_path)
    long_context = engine.config.calibration.long_context_tokens
    measured: list[float] = []
    measure = calibration_module._measure

    def recorded(engine: Engine, batch: int, prompt_chars: int) -> object:
        point = measure(engine, batch, prompt_chars)
        if prompt_chars == long_context:
            measured.append(point.sample.ms)
        return point

    monkeypatch.setattr(calibration_module, "_measure", recorded)
    calibration = load_or_calibrate(engine)
    assert calibration is not None and len(measured) == 2
    assert calibration.samples[-1].ms == max(measured)


def test_a_cached_calibration_is_followed_by_a_warm_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    measured = load_or_calibrate(_engine(tmp_path))
    assert measured is not None
    warmed: list[list[int]] = []
    real_warm_up = calibration_module.warm_up

    def counted_warm_up(engine: Engine, calibration: Calibration) -> list[int]:
        warmed.append(real_warm_up(engine, calibration))
        return warmed[-1]

    monkeypatch.setattr(calibration_module, "warm_up", counted_warm_up)
    engine = _engine(tmp_path)
    cached = load_or_calibrate(engine)
    assert cached is not None and cached.source == "cache"
    assert len(warmed) == 1
    batches = warmed[0]
    points = [tokens for tokens, _, _ in measured.model.decode_points]
    assert batches[0] == points[0] and set(batches) <= set(points)
    assert not engine.has_unfinished_requests()
    assert engine.take_report().steps == ()  # the warm-up's steps are not reported
    engine.check_integrity()
    assert engine.kv.pool.num_free_pages == engine.kv.pool.num_pages
    # A fresh measurement warms up on its own: no second warm-up.
    load_or_calibrate(_engine(tmp_path, mode="refresh"))
    assert len(warmed) == 1


def test_the_warm_up_needs_an_idle_engine(tmp_path: Path) -> None:
    engine = _engine(tmp_path)
    calibration = load_or_calibrate(engine)
    assert calibration is not None
    engine.add_request(SynthesisRequest("busy", "a stream being served", max_duration_s=1))
    with pytest.raises(RuntimeError, match="idle engine"):
        warm_up(engine, calibration)
    engine.abort_request("busy")


def test_cache_key_changes_with_what_changes_step_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = _engine(tmp_path)
    base = calibration_identity(engine, seed=0)
    assert calibration_identity(_engine(tmp_path), seed=1) != base
    assert calibration_identity(_engine(tmp_path), seed=0, neighbours=1) != base
    assert (
        calibration_identity(_engine(tmp_path, realtime=RealtimeConfig(chunk_ms=150.0)), seed=0)
        != base
    )
    # The native kernels: loaded or not, and for which level and ISA.
    kernels = loader.report()
    for changed in (
        tuple(
            dataclasses.replace(k, status="no_compiler" if k.loaded else "loaded") for k in kernels
        ),
        tuple(dataclasses.replace(k, level=f"not {k.level}", isa="avx2") for k in kernels),
    ):
        monkeypatch.setattr(loader, "report", lambda changed=changed: changed)
        assert calibration_identity(engine, seed=0) != base
    monkeypatch.setattr(loader, "report", lambda: kernels)
    assert calibration_identity(engine, seed=0) == base


def test_off_and_unreadable_cache(tmp_path: Path) -> None:
    assert load_or_calibrate(_engine(tmp_path, mode="off")) is None
    engine = _engine(tmp_path)
    identity = calibration_identity(engine, seed=0)
    (tmp_path / f"calibration-{identity}.json").write_text("{not json")
    calibration = load_or_calibrate(engine)  # measured again, cache rewritten
    assert calibration is not None and calibration.source == "measured"
    json.loads((tmp_path / f"calibration-{identity}.json").read_text())


def test_a_prompt_row_is_measured_on_prompts_of_three_lengths(tmp_path: Path) -> None:
    engine = _engine(tmp_path)
    fitted = _measure_prefill(engine)
    assert fitted is not None
    per_row, per_position = fitted
    assert per_row >= 0 and per_position >= 0 and per_row + per_position > 0
    assert not engine.has_unfinished_requests()
    engine.check_integrity()
    assert engine.kv.pool.num_free_pages == engine.kv.pool.num_pages
    # Where fewer than three lengths fit one step, the long prompts' flat cost stands.
    assert _measure_prefill(_engine(tmp_path, max_num_batched_tokens=128)) is None


def test_a_sweep_that_contradicts_itself_is_measured_again_and_never_cached(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Noise injected into every sweep's second pass at one point (as a busy neighbour
    would): each attempt is retried, the server serves a conservative calibration, says so,
    and caches nothing; a quiet sweep afterwards is cached."""
    engine = _engine(tmp_path, tolerance=0.35, attempts=2)
    measure = calibration_module._measure
    calls: list[int] = []

    def noisy(engine: Engine, batch: int, prompt_chars: int) -> object:
        point = measure(engine, batch, prompt_chars)
        if prompt_chars != SHORT_PROMPT_CHARS:
            return point
        calls.append(batch)
        if batch == 2 and calls.count(2) % 2 == 0:  # every second measurement of batch 2
            slowed = dataclasses.replace(point.sample, ms=point.sample.ms * 3)
            return dataclasses.replace(point, sample=slowed)
        return point

    monkeypatch.setattr(calibration_module, "_measure", noisy)
    # The noise is in the steps only: a loaded test machine's CPU share must not end the
    # attempts early here (test_a_sweep_measured_on_taken_cores_is_not_repeated).
    monkeypatch.setattr(calibration_module, "cores_taken", lambda calibration, tolerance: False)
    with caplog.at_level(logging.WARNING):
        calibration = load_or_calibrate(engine)
    assert calibration is not None and not calibration.consistent
    assert calibration.attempts == 2 and calls.count(2) == 4
    assert any("2 streams measured" in problem for problem in calibration.problems)
    assert calibration.jitter >= 1.5  # conservative
    assert "contradicts itself" in caplog.text and "conservative" in caplog.text
    assert not list(tmp_path.glob("calibration-*.json"))  # never cached
    engine.check_integrity()

    monkeypatch.setattr(calibration_module, "_measure", measure)
    quiet = load_or_calibrate(_engine(tmp_path, tolerance=100.0))
    assert quiet is not None and quiet.consistent and quiet.attempts == 1
    assert list(tmp_path.glob("calibration-*.json"))


def test_a_cached_calibration_that_contradicts_itself_is_measured_again(tmp_path: Path) -> None:
    calibration = load_or_calibrate(_engine(tmp_path))
    assert calibration is not None
    (path,) = tmp_path.glob("calibration-*.json")
    raw = json.loads(path.read_bytes())
    raw["repeats"][0]["again_ms"] = raw["repeats"][0]["first_ms"] * 5
    path.write_text(json.dumps(raw))
    strict = _engine(tmp_path, tolerance=0.35)
    assert read_cache(path, strict.config.calibration.tolerance) is None


def test_a_sweep_measured_on_taken_cores_is_not_repeated(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Something else ran on the engine's cores (two nodes calibrating side by side): a
    second sweep would meet it again, so the start goes on at once with a conservative
    calibration (measured again once idle); a sweep that only disagreed with itself is
    repeated as before."""
    example = engine_info().calibration
    assert example is not None
    taken = dataclasses.replace(
        example,
        repeats=(StepRepeat(2, 800, 2.0, 2.1, cpu_share=0.4),),
        problems=("the engine had 40% of its cores' time while measuring 2 streams",),
    )
    noisy = dataclasses.replace(
        example,
        repeats=(StepRepeat(2, 800, 2.0, 6.0, cpu_share=0.95),),
        problems=("2 streams measured 2.00 and 6.00 ms a step (200% apart)",),
    )
    stages: list[str] = []
    for attempt, expected in ((taken, 1), (noisy, 3)):
        sweeps: list[str] = []

        def sweep(
            engine: object,
            identity: str,
            attempt: Calibration = attempt,
            sweeps: list[str] = sweeps,
        ) -> Calibration:
            sweeps.append(identity)
            return attempt

        monkeypatch.setattr(calibration_module, "run_sweep", sweep)
        overrides = {"calibration": {"attempts": 3, "tolerance": 0.5}}
        engine = SimpleNamespace(config=load_config(overrides=overrides))
        with caplog.at_level(logging.WARNING):
            served = calibration_module._measure_consistent(
                engine,  # type: ignore[arg-type]
                "id",
                stages.append,
            )
        assert len(sweeps) == expected and served.attempts == expected
        assert not served.consistent and served.jitter >= 1.5  # conservative
    assert "no further attempt now" in caplog.text and "measures again once idle" in caplog.text
    assert stages == [
        "calibrating (attempt 1 of 3)",
        "calibrating (attempt 1 of 3)",
        "calibrating (attempt 2 of 3)",
        "calibrating (attempt 3 of 3)",
    ]
