import pytest

from cadenza.config import CadenzaConfig, ConfigError, config_reference, load_config


def test_defaults():
    config = load_config()
    assert config.server.port == 8000
    assert config.model.name == "cadenza-tiny"
    assert config.limits.max_input_chars == 4096


def test_priority_flags_over_env_over_file(tmp_path, monkeypatch):
    path = tmp_path / "cadenza.toml"
    path.write_text('[server]\nport = 9001\nhost = "0.0.0.0"\n[model]\nseed = 7\n')
    config = load_config(path)
    assert (config.server.port, config.server.host, config.model.seed) == (9001, "0.0.0.0", 7)

    monkeypatch.setenv("CADENZA_SERVER__PORT", "9002")
    config = load_config(path)
    assert config.server.port == 9002  # env beats file
    assert config.server.host == "0.0.0.0"  # file values the env does not touch survive

    config = load_config(path, {"server": {"port": 9003, "host": None}})
    assert config.server.port == 9003  # flags beat env
    assert config.server.host == "0.0.0.0"  # an unset flag (None) masks nothing


def test_unknown_key_in_file_is_an_error(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text("[server]\nprot = 1\n")
    with pytest.raises(ConfigError, match=r"server\.prot"):
        load_config(path)


def test_invalid_value_from_env(monkeypatch):
    monkeypatch.setenv("CADENZA_SERVER__PORT", "not-a-port")
    with pytest.raises(ConfigError, match=r"server\.port"):
        load_config()


def test_garbage_file(tmp_path):
    path = tmp_path / "garbage.toml"
    path.write_bytes(b"\x00\xff[[[")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(path)
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "missing.toml")


def test_round_trips_through_json():
    config = load_config(overrides={"engine": {"chunk_frames": 3}})
    again = CadenzaConfig.model_validate(config.model_dump(mode="json"))
    assert again == config


def test_reference_lists_every_key_with_its_variable():
    text = config_reference()
    assert "CADENZA_SERVER__PORT" in text
    assert "limits.max_input_chars" in text


@pytest.mark.parametrize(
    ("variable", "value", "where"),
    [
        ("CADENZA_ADMISSION__AGING_S", "0", "admission.aging_s"),
        ("CADENZA_ADMISSION__STANDARD_RESERVED_SHARE", "1.5", "admission.standard_reserved_share"),
        ("CADENZA_ENGINE__REALTIME_HEADROOM", "1", "engine.realtime_headroom"),
        ("CADENZA_ENGINE__CALIBRATION", "sometimes", "engine.calibration"),
        ("CADENZA_ENGINE__CALIBRATION_BATCH_SIZES", "[]", "engine.calibration_batch_sizes"),
        ("CADENZA_ENGINE__KV_DTYPE", "int4", "engine.kv_dtype"),
        ("CADENZA_ENGINE__KIND", "fast", "engine.kind"),
        ("CADENZA_MODEL__WEIGHTS_DTYPE", "int2", "model.weights_dtype"),
        ("CADENZA_ENGINE__CPU_LINEAR_DTYPE", "fp8", "engine.cpu_linear_dtype"),
        ("CADENZA_ENGINE__CODEC_DTYPE", "half", "engine.codec_dtype"),
        ("CADENZA_ENGINE__MAX_LEAD_MS", "0", "engine.max_lead_ms"),
        ("CADENZA_ENGINE__LEAD_HYSTERESIS_MS", "-1", "engine.lead_hysteresis_ms"),
        ("CADENZA_ENGINE__LEAD_HYSTERESIS_MS", "a while", "engine.lead_hysteresis_ms"),
        ("CADENZA_ADMISSION__JITTER_WINDOW_S", "-1", "admission.jitter_window_s"),
        ("CADENZA_ADMISSION__FACTOR_RECOVERY_S", "-1", "admission.factor_recovery_s"),
        ("CADENZA_ADMISSION__FACTOR_RECOVERY_S", "a minute", "admission.factor_recovery_s"),
        ("CADENZA_ADMISSION__REALTIME_MAX_WAIT_S", "soon", "admission.realtime_max_wait_s"),
        ("CADENZA_ADMISSION__UNMEASURED_FACTOR", "0.5", "admission.unmeasured_factor"),
        ("CADENZA_ADMISSION__UNMEASURED_FACTOR", "slow", "admission.unmeasured_factor"),
        ("CADENZA_ENGINE__REPLICAS", "0", "engine.replicas"),
        ("CADENZA_ENGINE__REPLICAS", "two", "engine.replicas"),
        ("CADENZA_ENGINE__HEARTBEAT_TIMEOUT_S", "0", "engine.heartbeat_timeout_s"),
        ("CADENZA_ENGINE__RESTART_BACKOFF_S", "-1", "engine.restart_backoff_s"),
        ("CADENZA_ENGINE__MAX_START_FAILURES", "0", "engine.max_start_failures"),
        ("CADENZA_ENGINE__RESUME_REPLAY_FRAMES", "-5", "engine.resume_replay_frames"),
        ("CADENZA_ENGINE__WARM_SPARE", "perhaps", "engine.warm_spare"),
        ("CADENZA_ENGINE__FUSED_CPU_DECODE", "maybe", "engine.fused_cpu_decode"),
        ("CADENZA_SERVER__DRAIN_TIMEOUT_S", "-1", "server.drain_timeout_s"),
        ("CADENZA_SERVER__RESUME_TIMEOUT_S", "later", "server.resume_timeout_s"),
        ("CADENZA_SERVER__GC_FREEZE", "sometimes", "server.gc_freeze"),
    ],
)
def test_admission_engine_availability_and_kernel_settings_refuse_garbage(
    monkeypatch, variable, value, where
):
    monkeypatch.setenv(variable, value)
    with pytest.raises(ConfigError, match=where.replace(".", r"\.")):
        load_config()
