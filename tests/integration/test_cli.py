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


ORPHEUS_3B_CONFIG = {
    "model_type": "llama",
    "hidden_size": 3072,
    "intermediate_size": 8192,
    "num_hidden_layers": 28,
    "num_attention_heads": 24,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "rms_norm_eps": 1e-5,
    "rope_theta": 500000.0,
    "rope_scaling": {
        "rope_type": "llama3",
        "factor": 32.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    },
    "tie_word_embeddings": True,
    "vocab_size": 156940,
}


def test_plan_sizes_a_3b_checkpoint_from_its_config_alone(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(ORPHEUS_3B_CONFIG))
    result = _cadenza(
        "plan", "--model", str(tmp_path), "--context", "2048", "--kv-dtype", "bf16", "--json"
    )
    assert result.returncode == 0, result.stderr
    plan = json.loads(result.stdout)
    assert plan["kv_bytes_per_token"] == 114_688
    assert plan["realtime"].startswith("not measured")


def test_generate_refuses_bad_sampling_and_uncached_hub_ids(tmp_path):
    out = str(tmp_path / "x.wav")
    result = _cadenza("generate", "--text", "hi", "--out", out, "--top-p", "2", "--device", "cpu")
    assert result.returncode == 2 and "top_p" in result.stderr
    result = _cadenza("generate", "--text", "hi", "--out", out, "--model", "nobody/nothing")
    assert result.returncode == 2 and "hf download nobody/nothing" in result.stderr


def test_generate_speaks_a_csm_checkpoint_as_the_reference_pipeline_does(tmp_path):
    import numpy as np

    from tests.support.float32_compute import FLOAT32_COMPUTE
    from tests.unit.engine.csm_checkpoints import (
        reference_generate,
        reference_prompt_ids,
        save_tiny_csm,
    )

    checkpoint = tmp_path / "csm"
    reference = save_tiny_csm(checkpoint)
    out = tmp_path / "csm.wav"
    # float32 compute (the reference's): the CPU's bf16 products would round differently.
    settings = tmp_path / "float32.toml"
    settings.write_text(
        "[cpu]\n" + "".join(f'{key} = "{value}"\n' for key, value in FLOAT32_COMPUTE.items())
    )
    result = _cadenza(
        "generate", "--model", str(checkpoint), "--voice", "0", "--text", "Good morning.",
        "--temperature", "0", "--max-duration-s", "0.4", "--out", str(out), "--device", "cpu",
        "--config", str(settings),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    with wave.open(io.BytesIO(out.read_bytes())) as reader:
        assert reader.getframerate() == 24000 and reader.getsampwidth() == 2
        got = np.frombuffer(reader.readframes(reader.getnframes()), dtype="<i2") / 32768.0
    ids = reference_prompt_ids(checkpoint, "Good morning.", "0")
    expected = reference_generate(reference, ids, 5, output_audio=True)[0].numpy()
    assert got.shape == expected.shape == (5 * 1920,)
    np.testing.assert_allclose(got, np.clip(expected, -1.0, 1.0), atol=2.0 / 32768)


def test_generate_speaks_a_bark_checkpoint_as_transformers_does(tmp_path):
    import numpy as np
    import torch
    from transformers import BarkProcessor

    from tests.support.float32_compute import FLOAT32_COMPUTE
    from tests.unit.engine.bark.bark_checkpoints import VOICE, build_tiny_bark

    checkpoint = tmp_path / "bark"
    reference = build_tiny_bark(checkpoint)
    out = tmp_path / "bark.wav"
    settings = tmp_path / "float32.toml"  # products and codec in float32, as transformers runs
    settings.write_text(
        "[cpu]\n" + "".join(f'{key} = "{value}"\n' for key, value in FLOAT32_COMPUTE.items())
    )
    result = _cadenza(
        "generate", "--model", str(checkpoint), "--voice", VOICE, "--text", "hello world",
        "--max-duration-s", "0.4", "--temperature", "0", "--out", str(out),
        "--config", str(settings),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    with wave.open(io.BytesIO(out.read_bytes())) as reader:
        assert reader.getframerate() == 24000
        got = np.frombuffer(reader.readframes(reader.getnframes()), dtype="<i2") / 32768.0
    inputs = BarkProcessor.from_pretrained(str(checkpoint))("hello world", voice_preset=VOICE)
    with torch.no_grad():
        expected = reference.generate(**inputs, semantic_max_new_tokens=20)[0].numpy()
    assert got.shape == expected.shape
    np.testing.assert_allclose(got, np.clip(expected, -1.0, 1.0), atol=2.0 / 32768)
    bad = _cadenza(
        "generate", "--model", str(checkpoint), "--voice", "v2/xx", "--text", "hi", "--out",
        str(out),
    )  # fmt: skip
    assert bad.returncode == 2 and "voice 'v2/xx' is not available" in bad.stderr
