"""Guided encoder-decoder models served: tiny random Dia (its DAC codec beside it) and MusicGen
(its EnCodec inside) checkpoints in the public layout, in a server with cadenza-tiny. Greedy
speech with ``guidance_scale`` over HTTP and WebSocket (``speak.guidance_scale``), at the
model's own 44.1 kHz when asked, equals ``transformers``' Dia + the DAC decode, as ``cadenza
generate --guidance-scale`` does; MusicGen's music lasts exactly ``max_duration_s`` and equals
``transformers``' guided greedy generate, over HTTP and by ``cadenza generate``; a model that
lacks a sampling field refuses it by name. A voice cloned from a clip and its transcript (Dia's
audio prompt) equals ``transformers``' over WebSocket (the microphone as a conversation turn)
and by ``cadenza generate --voice-audio --voice-text``; a clip ``cadenza generate`` cannot
use is refused with the reason."""

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
from cadenza.edge.media.resampler import resample
from cadenza.edge.media.wav import float_to_s16le, s16le_to_float
from tests.integration.server import serving
from tests.support.dia_checkpoints import reference_dia_generate, tiny_dia_checkpoint
from tests.support.float32_compute import FLOAT32_COMPUTE
from tests.support.musicgen_checkpoints import (
    max_new_tokens_for,
    reference_musicgen_generate,
    tiny_musicgen_checkpoint,
)

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


TRANSCRIPT = "[S1] This is how I sound."
MICROPHONE_RATE = 48000


@pytest.fixture(scope="module")
def voice(dia):
    """A voice to clone: 16-bit PCM at 48 kHz (about 16 frames once at 44.1 kHz), and
    transformers' new speech after it (the clip as the edge resamples it) and its
    transcript."""
    noise = np.random.default_rng(5).standard_normal(9000).astype(np.float32) * 0.1
    pcm = float_to_s16le(noise)
    clip = resample(s16le_to_float(pcm), MICROPHONE_RATE, RATE)
    [(_, audio)] = reference_dia_generate(
        dia[0],
        [f"{TRANSCRIPT} {TEXT}"],
        guidance_scale=3.0,
        max_new_tokens=FRAMES + 16,
        audio_prompt=[clip],
    )
    return pcm, np.clip(audio, -1.0, 1.0)


MUSIC = "calm piano with soft drums"
MUSIC_S = 0.4  # 20 frames at 50 a second
MUSIC_RATE = 32000


@pytest.fixture(scope="module")
def musicgen(tmp_path_factory):
    directory = tiny_musicgen_checkpoint(tmp_path_factory.mktemp("musicgen") / "musicgen-tiny")
    [(_, audio)] = reference_musicgen_generate(
        directory, [MUSIC], guidance_scale=3.0, max_new_tokens=max_new_tokens_for(20)
    )
    return directory, np.clip(audio, -1.0, 1.0)


@pytest.fixture(scope="module")
def server(tmp_path_factory, dia, musicgen):
    root = tmp_path_factory.mktemp("guided")
    config = root / "cadenza.toml"
    config.write_text(
        '[[models]]\nname = "cadenza-tiny"\npath = "cadenza-tiny"\n\n'
        f'[[models]]\nname = "dia-tiny"\npath = "{dia[0]}"\n\n'
        f'[[models]]\nname = "musicgen-tiny"\npath = "{musicgen[0]}"\n'
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


def test_websocket_conversation_clones_the_microphones_voice_as_transformers_does(
    server, voice
) -> None:
    pcm, expected = voice

    async def speak() -> np.ndarray:
        url = server.url.replace("http", "ws") + "/v1/stream"
        async with connect(url) as session:
            await session.send_microphone(pcm, sample_rate=MICROPHONE_RATE)
            chunks = [
                np.frombuffer(chunk.data, dtype="<i2")
                async for chunk in session.speak(
                    TEXT,
                    model="dia-tiny",
                    sample_rate=RATE,
                    max_duration_s=duration(FRAMES),
                    temperature=0.0,
                    guidance_scale=3.0,
                    conversation=True,
                    use_audio_prompt=True,
                    user_voice="default",
                    user_text=TRANSCRIPT,
                )
            ]
            return np.concatenate(chunks)

    got = asyncio.run(speak())
    assert got.shape == expected.shape  # the new speech only
    np.testing.assert_allclose(got / 32768.0, expected, atol=S16)


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


def test_http_music_lasts_its_duration_and_equals_transformers(server, musicgen) -> None:
    body = {
        "model": "musicgen-tiny",
        "input": MUSIC,
        "response_format": "wav",
        "max_duration_s": MUSIC_S,
        "temperature": 0.0,
        "guidance_scale": 3.0,
    }
    response = httpx.post(f"{server.url}/v1/audio/speech", json=body, timeout=120)
    assert response.status_code == 200, response.text
    with wave.open(io.BytesIO(response.content)) as reader:
        assert reader.getframerate() == MUSIC_RATE
        got = np.frombuffer(reader.readframes(reader.getnframes()), dtype="<i2") / 32768.0
    assert got.shape == (round(MUSIC_S * 50) * 640,)
    np.testing.assert_allclose(got, musicgen[1], atol=S16)


def run_generate(tmp_path, *args: str) -> subprocess.CompletedProcess[str]:
    """``cadenza generate`` in float32 compute (the reference's), greedy, into
    ``tmp_path / "out.wav"``."""
    settings = tmp_path / "float32.toml"
    settings.write_text(
        "[cpu]\n" + "".join(f'{key} = "{value}"\n' for key, value in FLOAT32_COMPUTE.items())
    )
    out = tmp_path / "out.wav"
    return subprocess.run(
        [
            sys.executable, "-m", "cadenza", "generate", *args, "--temperature", "0",
            "--out", str(out), "--device", "cpu", "--config", str(settings),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )  # fmt: skip


def generate(tmp_path, *args: str) -> tuple[np.ndarray, int]:
    """:func:`run_generate` guided at 3: the WAV's samples and rate."""
    result = run_generate(tmp_path, *args, "--guidance-scale", "3.0")
    assert result.returncode == 0, result.stderr
    with wave.open(io.BytesIO((tmp_path / "out.wav").read_bytes())) as reader:
        samples = np.frombuffer(reader.readframes(reader.getnframes()), dtype="<i2")
        return samples / 32768.0, reader.getframerate()


def test_generate_speaks_dia_with_guidance_as_transformers_does(tmp_path, dia) -> None:
    got, rate = generate(
        tmp_path, "--model", str(dia[0]), "--text", TEXT, "--max-duration-s", str(duration(FRAMES))
    )
    assert rate == RATE
    np.testing.assert_allclose(got, dia[1], atol=S16)


def test_generate_makes_music_as_transformers_does(tmp_path, musicgen) -> None:
    got, rate = generate(
        tmp_path, "--model", str(musicgen[0]), "--text", MUSIC, "--max-duration-s", str(MUSIC_S)
    )
    assert rate == MUSIC_RATE
    np.testing.assert_allclose(got, musicgen[1], atol=S16)


def write_wav(path, pcm: bytes, rate: int) -> str:
    with wave.open(str(path), "wb") as writer:
        writer.setnchannels(1)
        writer.setsampwidth(2)
        writer.setframerate(rate)
        writer.writeframes(pcm)
    return str(path)


def test_generate_clones_a_voice_from_a_wav_and_its_transcript(tmp_path, dia, voice) -> None:
    pcm, expected = voice
    clip = write_wav(tmp_path / "voice.wav", pcm, MICROPHONE_RATE)  # resampled to 44.1 kHz
    got, rate = generate(
        tmp_path,
        *("--model", str(dia[0]), "--text", TEXT, "--max-duration-s", str(duration(FRAMES))),
        *("--voice-audio", clip, "--voice-text", TRANSCRIPT),
    )
    assert rate == RATE
    np.testing.assert_allclose(got, expected, atol=S16)


def test_generate_refuses_a_clip_it_cannot_use_with_the_reason(tmp_path, dia, voice) -> None:
    pcm = voice[0]
    clip = write_wav(tmp_path / "voice.wav", pcm, 48000)
    odd_rate = write_wav(tmp_path / "odd.wav", pcm, 11025)
    dia_flags = ("--model", str(dia[0]), "--text", TEXT, "--max-duration-s", "0.1")
    cases = [
        ((*dia_flags, "--voice-audio", clip), "context turn 0 has no transcript"),
        (
            (*dia_flags, "--voice-audio", odd_rate, "--voice-text", TRANSCRIPT),
            "is at 11025 Hz; the model's codec takes 44100 Hz",
        ),
        (
            ("--model", "cadenza-tiny", "--text", "hi", "--voice-audio", clip, "--voice-text", "x"),
            "takes the clip as a speech prompt, without its transcript",
        ),
    ]
    for args, message in cases:
        result = run_generate(tmp_path, *args)
        assert result.returncode == 2, result.stderr
        assert message in result.stderr
