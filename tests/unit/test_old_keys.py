"""The previous release's ``[engine]`` keys and flags: still read, as their new keys, with a
warning once per key; frames become milliseconds; where both are given the new key wins."""

from __future__ import annotations

import logging

import pytest

from cadenza.cli import build_parser
from cadenza.cli.options import overrides
from cadenza.config import CadenzaConfig, ConfigError, EngineConfig, load_config
from cadenza.config import old_keys as old_keys_module
from cadenza.config.old_keys import OLD_KEYS
from cadenza.engine.chunk_policy import config_in_codec_frames

# Every key of the previous release's [engine] section, and where it went.
PREVIOUS_ENGINE_KEYS = {
    "kind", "mode", "chunk_frames", "first_chunk_frames", "startup_timeout_s", "replicas",
    "warm_spare", "heartbeat_timeout_s", "restart_backoff_s", "restart_backoff_max_s",
    "max_start_failures", "resume_replay_frames", "max_pending_requests", "page_size",
    "kv_dtype", "max_num_batched_tokens", "max_num_seqs", "enable_prefix_caching",
    "reserve_max_output", "kv_cache_memory_bytes", "pack_cpu_weights", "cpu_linear_dtype",
    "fused_cpu_decode", "codec_dtype", "kv_cache_memory_fraction", "ttfa_target_ms",
    "playout_reserve_ms", "prompt_ttfa_multiple", "max_lead_ms", "lead_hysteresis_ms",
    "realtime_headroom", "calibration", "calibration_batch_sizes", "calibration_steps",
    "calibration_long_context", "calibration_attempts", "calibration_tolerance",
    "calibration_cache_dir",
}  # fmt: skip
# Keys this release added to [engine].
NEW_ENGINE_KEYS = {"cuda_graphs", "overlap_steps"}


@pytest.fixture(autouse=True)
def fresh_warnings(monkeypatch, caplog):
    monkeypatch.setattr(old_keys_module, "_warned", set())
    monkeypatch.delenv("CADENZA_CALIBRATION__TOLERANCE", raising=False)  # tests/conftest.py's
    caplog.set_level(logging.WARNING, logger="cadenza")


def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "cadenza.config.old_keys"]


def test_every_previous_key_is_still_in_engine_or_read_as_its_new_key() -> None:
    kept = set(EngineConfig.model_fields)
    moved = {key.removeprefix("engine.") for key in OLD_KEYS if key.startswith("engine.")}
    assert kept | moved == PREVIOUS_ENGINE_KEYS | NEW_ENGINE_KEYS and not kept & moved
    for old_key in OLD_KEYS.values():
        section, name = old_key.new.split(".")
        section_type = CadenzaConfig.model_fields[section].annotation
        assert name in section_type.model_fields  # type: ignore[union-attr]
        assert old_key.frames_to_ms == old_key.old.endswith(("_frames", "_steps"))


def test_the_api_key_file_moved_to_auth_with_a_warning(monkeypatch, caplog, tmp_path) -> None:
    monkeypatch.setenv("CADENZA_SERVER__API_KEYS_FILE", str(tmp_path / "keys"))
    config = load_config()
    assert config.auth.api_keys_file == str(tmp_path / "keys")
    assert any("CADENZA_AUTH__API_KEYS_FILE" in line for line in _warnings(caplog))
    file = tmp_path / "cadenza.toml"
    file.write_text('[server]\napi_keys_file = "old"\nport = 9000\n[auth]\napi_keys_file = "new"\n')
    monkeypatch.delenv("CADENZA_SERVER__API_KEYS_FILE")
    config = load_config(config_file=file)
    assert config.auth.api_keys_file == "new" and config.server.port == 9000


def test_an_old_variable_is_read_as_its_new_key_with_a_warning(monkeypatch, caplog) -> None:
    monkeypatch.setenv("CADENZA_ENGINE__CALIBRATION_TOLERANCE", "7.5")
    monkeypatch.setenv("CADENZA_ENGINE__CHUNK_FRAMES", "3")
    monkeypatch.setenv("CADENZA_ENGINE__CALIBRATION_BATCH_SIZES", "[1, 2, 4]")
    monkeypatch.setenv("CADENZA_ENGINE__MODE", "inprocess")
    config = load_config()
    assert config.calibration.tolerance == 7.5 and config.calibration.batch_sizes == (1, 2, 4)
    assert config.supervision.mode == "inprocess"
    assert config.realtime.chunk_ms == pytest.approx(40.0)  # 3 frames at 75 Hz
    assert config_in_codec_frames(config, 75.0, 0, 1).chunk_frames == 3  # cut as before
    (warning,) = [w for w in _warnings(caplog) if "CHUNK_FRAMES" in w]
    assert warning == (
        "deprecated configuration key in the environment: CADENZA_ENGINE__CHUNK_FRAMES is "
        "read as CADENZA_REALTIME__CHUNK_MS (3 frames at 75 Hz = 40 ms) in this release only, "
        "and refused after it; use CADENZA_REALTIME__CHUNK_MS"
    )
    assert any("CADENZA_CALIBRATION__TOLERANCE" in w for w in _warnings(caplog))
    load_config()
    assert len(_warnings(caplog)) == 4  # once per key


def test_an_old_file_key_and_an_old_override(tmp_path, caplog) -> None:
    path = tmp_path / "old.toml"
    path.write_text(
        "[engine]\ncalibration_attempts = 2\ncalibration_steps = 15\nmax_num_seqs = 8\n"
        'calibration = "off"\nrealtime_headroom = 0.2\nfirst_chunk_frames = 8\n'
    )
    config = load_config(path, {"engine": {"replicas": 3, "cpu_linear_dtype": "float32"}})
    assert (config.calibration.attempts, config.calibration.mode) == (2, "off")
    assert config.calibration.duration_ms == pytest.approx(200.0)
    assert config.realtime.headroom == 0.2 and config.engine.max_num_seqs == 8
    assert config_in_codec_frames(config, 75.0, 0, 1).first_chunk_frames == 8
    assert (config.supervision.replicas, config.cpu.linear_dtype) == (3, "float32")
    messages = _warnings(caplog)
    assert any(
        "[engine] calibration_attempts is read as [calibration] attempts" in m for m in messages
    )
    assert any("engine.replicas is read as supervision.replicas" in m for m in messages)


def test_the_new_key_wins_over_the_old_in_the_same_source(tmp_path, monkeypatch, caplog) -> None:
    monkeypatch.setenv("CADENZA_ENGINE__CALIBRATION_ATTEMPTS", "2")
    monkeypatch.setenv("CADENZA_CALIBRATION__ATTEMPTS", "4")
    assert load_config().calibration.attempts == 4
    assert any(
        "sets both CADENZA_ENGINE__CALIBRATION_ATTEMPTS and CADENZA_CALIBRATION__ATTEMPTS" in m
        and "deprecated CADENZA_ENGINE__CALIBRATION_ATTEMPTS ignored" in m
        for m in _warnings(caplog)
    )


def test_an_old_key_counts_where_its_source_counts(tmp_path, monkeypatch) -> None:
    path = tmp_path / "new.toml"
    path.write_text("[calibration]\nattempts = 4\n")
    monkeypatch.setenv("CADENZA_ENGINE__CALIBRATION_ATTEMPTS", "2")
    assert load_config(path).calibration.attempts == 2  # the environment beats the file
    assert load_config(path, {"calibration": {"attempts": 5}}).calibration.attempts == 5


@pytest.mark.parametrize(
    ("variable", "value", "named"),
    [
        ("CADENZA_ENGINE__CALIBRATION_TOLERANCE", "abc", "calibration.tolerance"),
        ("CADENZA_ENGINE__CHUNK_FRAMES", "many", "CADENZA_ENGINE__CHUNK_FRAMES"),
        ("CADENZA_ENGINE__CHUNK_FRAMES", "0", "realtime.chunk_ms"),
        ("CADENZA_ENGINE__RESUME_REPLAY_FRAMES", "-5", "supervision.resume_replay_ms"),
        ("CADENZA_ENGINE__CALIBRATION_BATCH_SIZES", "[]", "calibration.batch_sizes"),
        ("CADENZA_ENGINE__WARM_SPARE", "perhaps", "supervision.warm_spare"),
    ],
)
def test_garbage_in_an_old_key_names_the_key(monkeypatch, variable, value, named) -> None:
    monkeypatch.setenv(variable, value)
    with pytest.raises(ConfigError) as error:
        load_config()
    message = str(error.value)
    old = variable.removeprefix("CADENZA_").lower().replace("__", ".")
    assert named in message and old in message and variable in message


def test_the_old_replicas_flag_with_a_warning(caplog) -> None:
    parser = build_parser()
    args = parser.parse_args(["serve", "--engine-replicas", "2"])
    assert overrides(args)["supervision"]["replicas"] == 2
    assert _warnings(caplog) == [
        "deprecated flag: --engine-replicas is read as --replicas in this release only, and "
        "refused after it; use --replicas"
    ]
    both = parser.parse_args(["serve", "--replicas", "3", "--engine-replicas", "2"])
    assert overrides(both)["supervision"]["replicas"] == 3
