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
    config = load_config(overrides={"realtime": {"chunk_ms": 40.0}})
    again = CadenzaConfig.model_validate(config.model_dump(mode="json"))
    assert again == config


def test_reference_lists_every_key_with_its_variable():
    text = config_reference()
    assert "CADENZA_SERVER__PORT" in text
    assert "limits.max_input_chars" in text
    assert "realtime.first_chunk_ms (env CADENZA_REALTIME__FIRST_CHUNK_MS, default 107.0)" in text


def test_each_owner_has_its_section(tmp_path, monkeypatch):
    path = tmp_path / "cadenza.toml"
    path.write_text(
        "[supervision]\nreplicas = 2\n[realtime]\nchunk_ms = 400\n"
        '[cpu]\nlinear_dtype = "float32"\n[calibration]\nattempts = 1\n'
    )
    monkeypatch.setenv("CADENZA_CALIBRATION__BATCH_SIZES", "[1, 2]")
    monkeypatch.setenv("CADENZA_CALIBRATION__DURATION_MS", "200")
    config = load_config(path, {"engine": {"max_num_seqs": 8}})
    assert (config.supervision.replicas, config.realtime.chunk_ms) == (2, 400.0)
    assert (config.cpu.linear_dtype, config.calibration.attempts) == ("float32", 1)
    assert config.calibration.batch_sizes == (1, 2) and config.calibration.duration_ms == 200.0
    assert config.engine.max_num_seqs == 8


def test_the_tree_reads_no_environment(monkeypatch):
    """Built from its arguments only: the engine process's copy is the edge's, as sent."""
    monkeypatch.setenv("CADENZA_SERVER__PORT", "9009")
    assert CadenzaConfig().server.port == 8000
    assert CadenzaConfig.model_validate({"server": {"port": 8001}}).server.port == 8001
    assert load_config().server.port == 9009


@pytest.mark.parametrize(
    ("variable", "value", "where"),
    [
        ("CADENZA_ADMISSION__AGING_S", "0", "admission.aging_s"),
        ("CADENZA_ADMISSION__STANDARD_RESERVED_SHARE", "1.5", "admission.standard_reserved_share"),
        ("CADENZA_REALTIME__HEADROOM", "1", "realtime.headroom"),
        ("CADENZA_REALTIME__CHUNK_MS", "0", "realtime.chunk_ms"),
        ("CADENZA_REALTIME__FIRST_CHUNK_MS", "soon", "realtime.first_chunk_ms"),
        ("CADENZA_CALIBRATION__MODE", "sometimes", "calibration.mode"),
        ("CADENZA_CALIBRATION__BATCH_SIZES", "[]", "calibration.batch_sizes"),
        ("CADENZA_CALIBRATION__DURATION_MS", "-1", "calibration.duration_ms"),
        ("CADENZA_CALIBRATION__TOLERANCE", "lots", "calibration.tolerance"),
        ("CADENZA_ENGINE__KV_DTYPE", "int4", "engine.kv_dtype"),
        ("CADENZA_ENGINE__KIND", "fast", "engine.kind"),
        ("CADENZA_MODEL__WEIGHTS_DTYPE", "int2", "model.weights_dtype"),
        ("CADENZA_CPU__LINEAR_DTYPE", "fp8", "cpu.linear_dtype"),
        ("CADENZA_CPU__CODEC_DTYPE", "half", "cpu.codec_dtype"),
        ("CADENZA_REALTIME__MAX_LEAD_MS", "0", "realtime.max_lead_ms"),
        ("CADENZA_REALTIME__LEAD_HYSTERESIS_MS", "-1", "realtime.lead_hysteresis_ms"),
        ("CADENZA_REALTIME__LEAD_HYSTERESIS_MS", "a while", "realtime.lead_hysteresis_ms"),
        ("CADENZA_ADMISSION__JITTER_WINDOW_S", "-1", "admission.jitter_window_s"),
        ("CADENZA_ADMISSION__FACTOR_RECOVERY_S", "-1", "admission.factor_recovery_s"),
        ("CADENZA_ADMISSION__FACTOR_RECOVERY_S", "a minute", "admission.factor_recovery_s"),
        ("CADENZA_ADMISSION__REALTIME_MAX_WAIT_S", "soon", "admission.realtime_max_wait_s"),
        ("CADENZA_ADMISSION__UNMEASURED_FACTOR", "0.5", "admission.unmeasured_factor"),
        ("CADENZA_ADMISSION__UNMEASURED_FACTOR", "slow", "admission.unmeasured_factor"),
        ("CADENZA_SUPERVISION__REPLICAS", "0", "supervision.replicas"),
        ("CADENZA_SUPERVISION__REPLICAS", "two", "supervision.replicas"),
        ("CADENZA_SUPERVISION__HEARTBEAT_TIMEOUT_S", "0", "supervision.heartbeat_timeout_s"),
        ("CADENZA_SUPERVISION__RESTART_BACKOFF_S", "-1", "supervision.restart_backoff_s"),
        ("CADENZA_SUPERVISION__MAX_START_FAILURES", "0", "supervision.max_start_failures"),
        ("CADENZA_SUPERVISION__RESUME_REPLAY_MS", "-5", "supervision.resume_replay_ms"),
        ("CADENZA_SUPERVISION__WARM_SPARE", "perhaps", "supervision.warm_spare"),
        ("CADENZA_SUPERVISION__MODE", "thread", "supervision.mode"),
        ("CADENZA_ENGINE__CUDA_GRAPHS", "sometimes", "engine.cuda_graphs"),
        ("CADENZA_ENGINE__MAX_NUM_SEQS", "0", "engine.max_num_seqs"),
        ("CADENZA_ENGINE__KV_CACHE_MEMORY_FRACTION", "1.5", "engine.kv_cache_memory_fraction"),
        ("CADENZA_CPU__FUSED_DECODE", "maybe", "cpu.fused_decode"),
        ("CADENZA_SERVER__DRAIN_TIMEOUT_S", "-1", "server.drain_timeout_s"),
        ("CADENZA_SERVER__RESUME_TIMEOUT_S", "later", "server.resume_timeout_s"),
        ("CADENZA_SERVER__GC_FREEZE", "sometimes", "server.gc_freeze"),
        ("CADENZA_SERVER__NODE_ID", "node a", "server.node_id"),
        ("CADENZA_SERVER__NODE_ID", "-leading-dash", "server.node_id"),
        ("CADENZA_SERVER__NODE_ID", "x" * 65, "server.node_id"),
        ("CADENZA_SERVER__AGENT_PORT", "70000", "server.agent_port"),
        ("CADENZA_SERVER__AGENT_PORT", "eighty", "server.agent_port"),
        ("CADENZA_ADMISSION__MAX_STREAMS", "0", "admission.max_streams"),
        ("CADENZA_ADMISSION__MAX_STREAMS", "lots", "admission.max_streams"),
        ("CADENZA_SERVER__FORWARDED_ALLOW_IPS", '["10.0.0.0/33"]', "server.forwarded_allow_ips"),
        ("CADENZA_SERVER__FORWARDED_ALLOW_IPS", '["a.proxy"]', "server.forwarded_allow_ips"),
        ("CADENZA_SERVER__FORWARDED_ALLOW_IPS", "10.0.0.1", "server.forwarded_allow_ips"),
        ("CADENZA_SERVER__WEBRTC_ICE_SERVERS", "turn:x:3478", "server.webrtc_ice_servers"),
    ],
)
def test_admission_engine_availability_and_kernel_settings_refuse_garbage(
    monkeypatch, variable, value, where
):
    monkeypatch.setenv(variable, value)
    with pytest.raises(ConfigError, match=where.replace(".", r"\.")):
        load_config()
