"""Kyutai Pocket TTS served: a tiny random checkpoint in the public layout (its audio tokenizer
beside it, preset voices ``alba`` and ``marius``) in a server of its own, in float32 compute,
streams unpaced, with the server's length rule (``limits.chars_per_second``) loose enough that
the model's own rule (its end of speech, or its frame budget from the text) ends every stream.
Greedy speech (``temperature`` 0: no flow noise) equals ``transformers``'
``generate(do_sample=False)`` and the processor's decode, frame count included: over HTTP
without a voice and with a preset voice, for a text its end of speech ends and one its frame
budget ends; over WebSocket with the microphone's clip as the speech prompt; and by ``cadenza
generate``, with and without a ``--voice-audio`` clip at 48 kHz (resampled to 24 kHz); text
streamed in speaks as the whole text does; a WebRTC peer hears it. Four
streams at once (both voices, both endings) are batched by the engine and each equals its own
reference. ``cadenza plan`` prices the model's paged KV and measures its real-time capacity.
Refused by name: an unknown voice, the model-specific sampling fields Pocket TTS lacks
(``fine_temperature``, ``guidance_scale``), blank text, and ``--voice-text`` (the clip is a
speech prompt, without its transcript)."""

from __future__ import annotations

import asyncio
import io
import json
import os
import subprocess
import sys
import threading
import time
import wave
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import pytest

from cadenza.client.sdk import StreamError, connect
from cadenza.edge.media.resampler import resample
from cadenza.edge.media.wav import float_to_s16le, s16le_to_float
from tests.integration.server import serving
from tests.support.float32_compute import FLOAT32_COMPUTE
from tests.support.pocket_tts_checkpoints import (
    SAMPLING_RATE,
    SEED0_ENDINGS,
    reference_pocket_tts_run,
    voice_clip,
    write_pocket_tts_checkpoint,
)

FLOAT32 = {f"CADENZA_CPU__{key.upper()}": value for key, value in FLOAT32_COMPUTE.items()}
# One second of audio per character: longer than any text's frame budget from the model.
MODEL_ENDS = {"CADENZA_LIMITS__CHARS_PER_SECOND": "1"}
# Streams generated as fast as the engine steps, not held to a lead on their listeners.
UNPACED = {"CADENZA_REALTIME__MAX_LEAD_MS": "600000"}
MODEL = "pocket-tiny"
S16 = 2.0 / 32768  # two steps of 16-bit rounding

EOS_TEXT = "Hello world."  # ended by its end of speech (SEED0_ENDINGS)
LENGTH_TEXT = "This is a test of the speech model."  # ended by its frame budget
CLIP_RATE = 48000  # the WAV clip cadenza generate resamples to 24 kHz

Reference = Callable[..., np.ndarray]


@pytest.fixture(scope="module")
def pocket(tmp_path_factory):
    return write_pocket_tts_checkpoint(tmp_path_factory.mktemp("pocket") / MODEL)


@pytest.fixture(scope="module")
def reference(pocket) -> Reference:
    """``reference(text, voice=None, clip=None)``: ``transformers``' greedy waveform for
    ``text`` (with the preset ``voice``, or the 24 kHz ``clip`` as the speech prompt), clipped
    to [-1, 1] as the server's audio is; a text and preset of :data:`SEED0_ENDINGS` ends as
    listed there. Each run once."""
    runs: dict[tuple[str, str | None, bytes | None], np.ndarray] = {}

    def waveform(text: str, voice: str | None = None, clip: np.ndarray | None = None) -> np.ndarray:
        key = (text, voice, None if clip is None else clip.tobytes())
        if key not in runs:
            run = reference_pocket_tts_run(pocket, text, voice_audio=clip, voice=voice)
            if clip is None and (text, voice) in SEED0_ENDINGS:
                assert (run.ended_by, run.frames) == SEED0_ENDINGS[(text, voice)]
            runs[key] = np.clip(run.waveform.numpy(), -1.0, 1.0)
        return runs[key]

    return waveform


@pytest.fixture(scope="module")
def server(tmp_path_factory, pocket):
    root = tmp_path_factory.mktemp("pocket-served")
    config = root / "cadenza.toml"
    config.write_text(f'[[models]]\nname = "{MODEL}"\npath = "{pocket}"\n')
    env = {**FLOAT32, **MODEL_ENDS, **UNPACED}
    with serving(root / "server.log", env=env, args=("--config", str(config))) as running:
        yield running


def speech(server, text: str, voice: str = "default", **fields: object) -> httpx.Response:
    body = {"model": MODEL, "input": text, "voice": voice, "response_format": "pcm", **fields}
    return httpx.post(f"{server.url}/v1/audio/speech", json=body, timeout=120)


def greedy_speech(server, text: str, voice: str = "default") -> np.ndarray:
    """The server's greedy audio (s16le at 24 kHz) for ``text`` in ``voice``, as floats."""
    response = speech(server, text, voice, temperature=0.0)
    assert response.status_code == 200, response.text
    return s16le_to_float(response.content)


def differs(audio: np.ndarray, other: np.ndarray) -> bool:
    """Whether two waveforms differ by more than rounding (in length, or somewhere by 0.01)."""
    return audio.shape != other.shape or float(np.abs(audio - other).max()) > 0.01


def test_pocket_is_listed_at_24khz_with_its_voices_and_no_model_specific_fields(server) -> None:
    models = {m["id"]: m for m in httpx.get(f"{server.url}/v1/models").json()["data"]}
    assert models[MODEL]["sample_rate"] == SAMPLING_RATE
    assert models[MODEL]["voices"] == ["default", "alba", "marius"]
    assert models[MODEL]["sampling_fields"] == []


@pytest.mark.parametrize("voice", [None, "alba"])
@pytest.mark.parametrize("text", [EOS_TEXT, LENGTH_TEXT])
def test_http_greedy_speech_equals_transformers(server, reference, text, voice) -> None:
    expected = reference(text, voice)
    got = greedy_speech(server, text, voice or "default")
    assert got.shape == expected.shape  # the same frames: the model's own ending
    np.testing.assert_allclose(got, expected, atol=S16)


def test_websocket_speech_prompt_from_the_microphone_equals_transformers(server, reference) -> None:
    pcm = float_to_s16le(voice_clip())
    expected = reference(EOS_TEXT, clip=s16le_to_float(pcm))  # the clip as the server hears it
    assert differs(expected, reference(EOS_TEXT))  # the voice is heard

    async def speak() -> tuple[np.ndarray, int]:
        url = server.url.replace("http", "ws") + "/v1/stream"
        async with connect(url) as session:
            await session.send_microphone(pcm, sample_rate=SAMPLING_RATE)
            chunks = [
                np.frombuffer(chunk.data, dtype="<i2")
                async for chunk in session.speak(
                    EOS_TEXT, model=MODEL, temperature=0.0, use_audio_prompt=True
                )
            ]
            assert session.last_started is not None
            return np.concatenate(chunks), session.last_started["sample_rate"]

    got, rate = asyncio.run(speak())
    assert rate == SAMPLING_RATE
    assert got.shape == expected.shape
    np.testing.assert_allclose(got / 32768.0, expected, atol=S16)


def test_text_streamed_in_speaks_as_the_whole_text_does(server, reference) -> None:
    """The text arrives in pieces while the stream is open; one sentence is one segment."""
    expected = reference(EOS_TEXT)

    async def pieces():
        for piece in ("Hello ", "world", "."):
            yield piece
            await asyncio.sleep(0.05)

    async def speak() -> np.ndarray:
        url = server.url.replace("http", "ws") + "/v1/stream"
        async with connect(url) as session:
            chunks = [
                np.frombuffer(chunk.data, dtype="<i2")
                async for chunk in session.speak_stream(pieces(), model=MODEL, temperature=0.0)
            ]
        return np.concatenate(chunks)

    got = asyncio.run(speak())
    assert got.shape == expected.shape
    np.testing.assert_allclose(got / 32768.0, expected, atol=S16)


def test_a_webrtc_peer_hears_pocket_speech(server) -> None:
    from cadenza.client.webrtc import WebRTCPeer

    async def main() -> tuple[dict, int]:
        peer = WebRTCPeer(server.url)
        try:
            await peer.connect()
            peer.send({"type": "speak", "text": EOS_TEXT, "model": MODEL, "temperature": 0.0})
            done = await peer.next_event({"done", "error"})
            await asyncio.sleep(0.3)
        finally:
            await peer.close()
        return done, peer.result.loud_samples()

    done, loud = asyncio.run(main())
    assert done["type"] == "done", done
    assert loud > 1000


def test_streams_at_once_each_equal_their_own_reference(server, reference) -> None:
    cases = [(LENGTH_TEXT, "alba"), (EOS_TEXT, None), (LENGTH_TEXT, None), (EOS_TEXT, "alba")]
    expected = [reference(text, voice) for text, voice in cases]
    start = threading.Barrier(len(cases))

    def one(case: tuple[str, str | None]) -> np.ndarray:
        start.wait()
        return greedy_speech(server, case[0], case[1] or "default")

    batched_before = batched_steps(server)
    with ThreadPoolExecutor(len(cases)) as pool:
        got = list(pool.map(one, cases))
    for case, heard, wanted in zip(cases, got, expected, strict=True):
        assert heard.shape == wanted.shape, case
        np.testing.assert_allclose(heard, wanted, atol=S16, err_msg=str(case))
    time.sleep(0.6)  # the engine's stats arrive every 0.5 s
    assert batched_steps(server) > batched_before, "no engine step decoded two streams"


def batched_steps(server) -> float:
    """Engine steps so far that decoded more than one stream."""
    steps = server.metric("cadenza_engine_step_decode_tokens_count")
    return steps - server.metric(
        f'cadenza_engine_step_decode_tokens_bucket{{le="1.0",model="{MODEL}"}}'
    )


def test_an_unknown_voice_is_refused_with_the_voices_there_are(server) -> None:
    response = speech(server, EOS_TEXT, "nobody")
    error = response.json()["error"]
    assert response.status_code == 400 and error["code"] == "voice_not_found"
    assert error["param"] == "voice" and "default, alba, marius" in error["message"]

    async def speak() -> None:
        url = server.url.replace("http", "ws") + "/v1/stream"
        async with connect(url) as session:
            async for _ in session.speak(EOS_TEXT, model=MODEL, voice="nobody"):
                pass

    with pytest.raises(StreamError) as refused:
        asyncio.run(speak())
    assert refused.value.code == "voice_not_found"


@pytest.mark.parametrize("field", ["fine_temperature", "guidance_scale"])
def test_a_sampling_field_pocket_lacks_is_refused_by_name(server, field) -> None:
    response = speech(server, EOS_TEXT, **{field: 2.0})
    error = response.json()["error"]
    assert response.status_code == 400 and error["code"] == "unsupported_sampling_field"
    assert error["param"] == field and field in error["message"]


@pytest.mark.parametrize("text", ["", "   \n\t"])
def test_blank_text_is_refused(server, text) -> None:
    response = speech(server, text)
    error = response.json()["error"]
    assert response.status_code == 400 and error["code"] == "empty_input"


def run_cadenza(tmp_path, *args: str) -> subprocess.CompletedProcess[str]:
    """``cadenza ARGS`` on the CPU in float32 compute, with the model's own length rule."""
    settings = tmp_path / "settings.toml"
    settings.write_text(
        "[cpu]\n"
        + "".join(f'{key} = "{value}"\n' for key, value in FLOAT32_COMPUTE.items())
        + "\n[limits]\nchars_per_second = 1\n"
    )
    env = {
        **os.environ,
        "CADENZA_CALIBRATION__CACHE_DIR": str(tmp_path / "calibration"),
        "CADENZA_CALIBRATION__BATCH_SIZES": "[1, 2]",  # a short sweep
    }
    return subprocess.run(
        [sys.executable, "-m", "cadenza", *args, "--config", str(settings)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )


def run_generate(tmp_path, pocket, text: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``cadenza generate`` of ``text`` with the checkpoint, greedy, into ``out.wav``."""
    out = tmp_path / "out.wav"
    return run_cadenza(
        tmp_path, "generate", "--model", str(pocket), "--text", text, "--temperature", "0",
        "--out", str(out), "--device", "cpu", *args,
    )  # fmt: skip


def generated(tmp_path) -> np.ndarray:
    with wave.open(io.BytesIO((tmp_path / "out.wav").read_bytes())) as reader:
        assert reader.getframerate() == SAMPLING_RATE
        return np.frombuffer(reader.readframes(reader.getnframes()), dtype="<i2") / 32768.0


def test_generate_speaks_as_transformers_does(tmp_path, pocket, reference) -> None:
    result = run_generate(tmp_path, pocket, LENGTH_TEXT)
    assert result.returncode == 0, result.stderr
    expected = reference(LENGTH_TEXT)
    got = generated(tmp_path)
    assert got.shape == expected.shape
    np.testing.assert_allclose(got, expected, atol=S16)


def write_wav(path, pcm: bytes, rate: int) -> str:
    with wave.open(str(path), "wb") as writer:
        writer.setnchannels(1)
        writer.setsampwidth(2)
        writer.setframerate(rate)
        writer.writeframes(pcm)
    return str(path)


def test_generate_clones_the_voice_of_a_48khz_clip_as_transformers_does(
    tmp_path, pocket, reference
) -> None:
    pcm = float_to_s16le(resample(voice_clip(seed=1), SAMPLING_RATE, CLIP_RATE))
    clip = write_wav(tmp_path / "voice.wav", pcm, CLIP_RATE)
    result = run_generate(tmp_path, pocket, EOS_TEXT, "--voice-audio", clip)
    assert result.returncode == 0, result.stderr
    # the clip as cadenza generate resamples it
    expected = reference(EOS_TEXT, clip=resample(s16le_to_float(pcm), CLIP_RATE, SAMPLING_RATE))
    assert differs(expected, reference(EOS_TEXT))
    got = generated(tmp_path)
    assert got.shape == expected.shape
    np.testing.assert_allclose(got, expected, atol=S16)


def test_generate_refuses_a_transcript_of_the_clip(tmp_path, pocket) -> None:
    clip = write_wav(tmp_path / "voice.wav", float_to_s16le(voice_clip()), SAMPLING_RATE)
    result = run_generate(
        tmp_path, pocket, EOS_TEXT, "--voice-audio", clip, "--voice-text", "Hello world."
    )
    assert result.returncode == 2, result.stderr
    assert "takes the clip as a speech prompt" in result.stderr
    assert not (tmp_path / "out.wav").exists()


def test_plan_prices_the_paged_kv_and_measures_pocket(tmp_path, pocket) -> None:
    # As the issue words it: no --context, the nominal stream's (64 characters, 10 s of audio).
    result = run_cadenza(tmp_path, "plan", "--model", str(pocket), "--json", "--memory", "1GiB")
    assert result.returncode == 0, result.stderr
    plan = json.loads(result.stdout)
    assert (plan["layers"], plan["kv_heads"], plan["head_dim"]) == (2, 4, 16)
    assert plan["kv_bytes_per_token"] == 2 * 2 * 4 * 16 * 2  # K and V, layers, heads, dim, bf16
    assert plan["context"] >= 125  # at least 10 s of frames at 12.5 a second
    context = plan["context"]
    assert plan["sequences_that_fit"] == 2**30 // (plan["kv_bytes_per_token"] * context)
    assert "state_bytes_per_sequence" not in plan  # all of a stream's state is in the paged KV
    realtime = plan["realtime"]
    assert realtime["calibration_consistent"] and realtime["max_streams_per_replica"] >= 1
