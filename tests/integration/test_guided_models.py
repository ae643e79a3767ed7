"""Guided encoder-decoder models served: a tiny random Dia checkpoint in the public layout (its
DAC codec beside it) in a server with cadenza-tiny; greedy speech with ``guidance_scale`` over
HTTP and WebSocket (``speak.guidance_scale``), at the model's own 44.1 kHz when asked, equals
``transformers``' Dia + the DAC decode, as ``cadenza generate --guidance-scale`` does; a model
that lacks a sampling field refuses it by name."""

from __future__ import annotations

import asyncio
import io
import subprocess
import sys
import wave

import httpx
import numpy as np
import pytest

from cadenza.client.sdk import StreamError, connect
from tests.integration.server import serving
from tests.support.dia_checkpoints import reference_dia_generate, tiny_dia_checkpoint
from tests.support.float32_compute import FLOAT32_COMPUTE

FLOAT32 = {f"CADENZA_CPU__{key.upper()}": value for key, value in FLOAT32_COMPUTE.items()}
TEXT = "[S1] Hello there. [S2] Hi!"
FRAMES = 20
RATE = 44100
S16 = 2.0 / 32768  # two steps of 16-bit rounding


@pytest.fixture(scope="module")
def dia(tmp_path_factory):
    directory = tiny_dia_checkpoint(tmp_path_factory.mktemp("dia") / "dia-tiny")
    [(_, audio)] = reference_dia_generate(
        directory, [TEXT], guidance_scale=3.0, max_new_tokens=FRAMES + 16
    )
    return directory, np.clip(audio, -1.0, 1.0)


@pytest.fixture(scope="module")
def server(tmp_path_factory, dia):
    root = tmp_path_factory.mktemp("guided")
    config = root / "cadenza.toml"
    config.write_text(
        '[[models]]\nname = "cadenza-tiny"\npath = "cadenza-tiny"\n\n'
        f'[[models]]\nname = "dia-tiny"\npath = "{dia[0]}"\n'
    )
    with serving(root / "server.log", env=FLOAT32, args=("--config", str(config))) as running:
        yield running


def duration(frames: int) -> float:
    return (frames + 0.5) / (RATE / 512)


def test_dia_is_listed_at_its_own_rate_with_its_sampling_fields(server) -> None:
    models = {m["id"]: m for m in httpx.get(f"{server.url}/v1/models").json()["data"]}
    assert models["dia-tiny"]["sample_rate"] == RATE
    assert models["dia-tiny"]["sampling_fields"] == ["guidance_scale"]
    assert models["cadenza-tiny"]["sampling_fields"] == []


def test_http_guided_speech_equals_transformers(server, dia) -> None:
    body = {
        "model": "dia-tiny",
        "input": TEXT,
        "response_format": "wav",
        "max_duration_s": duration(FRAMES),
        "temperature": 0.0,
        "guidance_scale": 3.0,
    }
    response = httpx.post(f"{server.url}/v1/audio/speech", json=body, timeout=120)
    assert response.status_code == 200, response.text
    with wave.open(io.BytesIO(response.content)) as reader:
        assert reader.getframerate() == RATE
        got = np.frombuffer(reader.readframes(reader.getnframes()), dtype="<i2") / 32768.0
    np.testing.assert_allclose(got, dia[1], atol=S16)


def test_websocket_guided_speech_equals_transformers_at_the_models_rate(server, dia) -> None:
    async def speak() -> tuple[np.ndarray, int]:
        url = server.url.replace("http", "ws") + "/v1/stream"
        async with connect(url) as session:
            chunks = [
                np.frombuffer(chunk.data, dtype="<i2")
                async for chunk in session.speak(
                    TEXT,
                    model="dia-tiny",
                    sample_rate=RATE,
                    max_duration_s=duration(FRAMES),
                    temperature=0.0,
                    guidance_scale=3.0,
                )
            ]
            assert session.last_started is not None
            return np.concatenate(chunks), session.last_started["sample_rate"]

    got, rate = asyncio.run(speak())
    assert rate == RATE
    np.testing.assert_allclose(got / 32768.0, dia[1], atol=S16)


def test_websocket_pcm_without_a_rate_comes_at_the_highest_offered(server) -> None:
    async def speak() -> int:
        url = server.url.replace("http", "ws") + "/v1/stream"
        async with connect(url) as session:
            async for _ in session.speak(TEXT, model="dia-tiny", max_duration_s=0.1):
                pass
            assert session.last_started is not None
            return int(session.last_started["sample_rate"])

    assert asyncio.run(speak()) == 48000


def test_a_sampling_field_the_model_lacks_is_refused_by_name(server) -> None:
    body = {"model": "dia-tiny", "input": TEXT, "fine_temperature": 0.5}
    response = httpx.post(f"{server.url}/v1/audio/speech", json=body, timeout=30)
    error = response.json()["error"]
    assert response.status_code == 400 and error["code"] == "unsupported_sampling_field"
    assert error["param"] == "fine_temperature" and "guidance_scale" in error["message"]
    body = {"model": "cadenza-tiny", "input": "hello", "guidance_scale": 3.0}
    response = httpx.post(f"{server.url}/v1/audio/speech", json=body, timeout=30)
    assert response.json()["error"]["param"] == "guidance_scale"
    body = {"model": "dia-tiny", "input": TEXT, "guidance_scale": 0.5}
    response = httpx.post(f"{server.url}/v1/audio/speech", json=body, timeout=30)
    assert response.status_code == 400 and "above 1" in response.json()["error"]["message"]

    async def speak() -> None:
        url = server.url.replace("http", "ws") + "/v1/stream"
        async with connect(url) as session:
            async for _ in session.speak("hello", model="cadenza-tiny", guidance_scale=2.0):
                pass

    with pytest.raises(StreamError) as refused:
        asyncio.run(speak())
    assert refused.value.code == "unsupported_sampling_field"


def test_generate_speaks_dia_with_guidance_as_transformers_does(tmp_path, dia) -> None:
    settings = tmp_path / "float32.toml"
    settings.write_text(
        "[cpu]\n" + "".join(f'{key} = "{value}"\n' for key, value in FLOAT32_COMPUTE.items())
    )
    out = tmp_path / "dia.wav"
    result = subprocess.run(
        [
            sys.executable, "-m", "cadenza", "generate", "--model", str(dia[0]), "--text", TEXT,
            "--temperature", "0", "--guidance-scale", "3.0", "--max-duration-s",
            str(duration(FRAMES)), "--out", str(out), "--device", "cpu", "--config", str(settings),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    with wave.open(io.BytesIO(out.read_bytes())) as reader:
        assert reader.getframerate() == RATE
        got = np.frombuffer(reader.readframes(reader.getnframes()), dtype="<i2") / 32768.0
    np.testing.assert_allclose(got, dia[1], atol=S16)
