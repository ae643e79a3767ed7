"""Start-up calibration on the real engine: a small sweep, its cache, and the engine left idle."""

from __future__ import annotations

import json
from pathlib import Path

from cadenza.config import EngineConfig
from cadenza.engine.calibration import Calibration, calibration_identity, load_or_calibrate
from cadenza.engine.engine import Engine


def _engine(cache: Path, **overrides: object) -> Engine:
    config = EngineConfig(
        calibration_batch_sizes=(1, 2),
        calibration_steps=15,
        calibration_long_context=64,
        calibration_cache_dir=str(cache),
        kv_cache_memory_bytes=32 << 20,
        **overrides,  # type: ignore[arg-type]
    )
    return Engine.from_pretrained("cadenza-tiny", engine_config=config)


def test_sweep_fits_a_model_caches_it_and_leaves_the_engine_idle(tmp_path: Path) -> None:
    engine = _engine(tmp_path)
    calibration = load_or_calibrate(engine)
    assert calibration is not None and calibration.source == "measured"
    assert [p[0] for p in calibration.model.decode_points] == [1, 2]
    assert len(calibration.samples) == 3  # two batch sizes and the long-context point
    assert all(s.ms > 0 for s in calibration.samples)
    assert calibration.codec_ms_per_frame > 0
    assert engine.step_model == calibration.model
    assert not engine.has_unfinished_requests()
    engine.check_integrity()
    assert engine.block_pool.num_free_blocks == engine.block_pool.num_blocks

    cached = json.loads(next(tmp_path.glob("calibration-*.json")).read_text())
    assert Calibration.from_dict(cached).model == calibration.model
    again = load_or_calibrate(_engine(tmp_path))
    assert again is not None and again.source == "cache" and again.model == calibration.model


def test_cache_key_changes_with_what_changes_step_time(tmp_path: Path) -> None:
    base = calibration_identity(_engine(tmp_path), seed=0)
    assert calibration_identity(_engine(tmp_path), seed=1) != base
    assert calibration_identity(_engine(tmp_path, chunk_frames=10), seed=0) != base


def test_off_and_unreadable_cache(tmp_path: Path) -> None:
    assert load_or_calibrate(_engine(tmp_path, calibration="off")) is None
    engine = _engine(tmp_path)
    identity = calibration_identity(engine, seed=0)
    (tmp_path / f"calibration-{identity}.json").write_text("{not json")
    calibration = load_or_calibrate(engine)  # measured again, cache rewritten
    assert calibration is not None and calibration.source == "measured"
    json.loads((tmp_path / f"calibration-{identity}.json").read_text())
