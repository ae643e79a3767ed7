import io
import json
import subprocess
import sys
import wave


def _cadenza(*args, timeout=120):
    return subprocess.run(
        [sys.executable, "-m", "cadenza", *args], capture_output=True, text=True, timeout=timeout
    )


def test_generate_writes_a_wav(tmp_path):
    out = tmp_path / "out.wav"
    result = _cadenza(
        "generate", "--text", "x" * 28, "--out", str(out), "--seed", "3", "--device", "cpu"
    )
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["audio_s"] == 2.0
    with wave.open(io.BytesIO(out.read_bytes())) as reader:
        assert reader.getframerate() == 24000
        assert reader.getnframes() == 2 * 24000


def test_generate_with_int8_kv_and_weights(tmp_path):
    out = tmp_path / "int8.wav"
    result = _cadenza(
        "generate", "--text", "x" * 14, "--out", str(out), "--kv-dtype", "int8",
        "--weights-dtype", "int8", "--device", "cpu",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["audio_s"] == 1.0
    bad = _cadenza("generate", "--text", "x", "--out", str(out), "--kv-dtype", "int4")
    assert bad.returncode == 2 and "int4" in bad.stderr


def test_generate_refuses_bad_input(tmp_path):
    result = _cadenza(
        "generate", "--text", "x" * 5000, "--out", str(tmp_path / "x.wav"), "--device", "cpu"
    )
    assert result.returncode == 2 and "4096" in result.stderr
    result = _cadenza(
        "generate", "--text", "hi", "--out", str(tmp_path / "x.wav"), "--model", "nope"
    )
    assert result.returncode == 2 and "unknown model" in result.stderr


def test_bad_config_file_is_a_clear_error(tmp_path):
    config = tmp_path / "c.toml"
    config.write_text("[server]\nport = 'eighty'\n")
    result = _cadenza("serve", "--config", str(config))
    assert result.returncode == 2
    assert "server.port" in result.stderr


def test_serve_help_documents_the_configuration():
    result = _cadenza("serve", "--help")
    assert result.returncode == 0
    assert "CADENZA_SERVER__PORT" in result.stdout
    assert "limits.max_input_chars" in result.stdout


def test_unusable_api_key_file_stops_serve(tmp_path):
    keys = tmp_path / "keys"
    keys.write_text("sha256:not-hex\n")
    result = _cadenza("serve", "--api-keys-file", str(keys), "--port", "0")
    assert result.returncode == 2 and "64 hex digits" in result.stderr
