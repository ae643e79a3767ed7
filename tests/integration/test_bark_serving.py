"""Bark served beside another model: a tiny random Bark checkpoint in the public layout and
cadenza-tiny in one server, each in its own engine process. Bark's voices are listed, its
audio over HTTP equals the offline path's to the 16-bit sample (greedy), it streams over
WebSocket and WebRTC, a text stream speaks more than one Bark prompt takes, a stream whose
engine dies goes on elsewhere from what its listener heard, what Bark cannot do is refused
with the reason, and ``cadenza plan`` prices its stages."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time

import httpx
import numpy as np
import pytest

from cadenza.client.sdk import StreamError, connect
from cadenza.client.webrtc import WebRTCPeer
from cadenza.contract.sampling import SamplingParams
from cadenza.engine.engine import Engine
from cadenza.engine.offline import synthesize
from tests.integration.server import serving, wait_until_idle
from tests.unit.engine.bark.bark_checkpoints import SHORT_VOICE, VOICE, build_tiny_bark

TEXT = "hello world the quick brown fox"


@pytest.fixture(scope="module")
def bark_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("bark") / "bark-tiny"
    build_tiny_bark(directory)
    return directory


@pytest.fixture(scope="module")
def offline(bark_dir):
    """The same checkpoint offline (the server's defaults): greedy audio of a text."""
    engine = Engine.from_pretrained(str(bark_dir))

    def speak(text: str, voice: str, seconds: float) -> np.ndarray:
        greedy = SamplingParams(temperature=0.0)
        return synthesize(engine, text, voice=voice, max_duration_s=seconds, sampling=greedy)

    return speak


@pytest.fixture(scope="module")
def server(bark_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("bark-server")
    config = root / "cadenza.toml"
    config.write_text(
        '[[models]]\nname = "cadenza-tiny"\npath = "cadenza-tiny"\n\n'
        f'[[models]]\nname = "bark-tiny"\npath = "{bark_dir}"\n'
    )
    with serving(root / "server.log", args=("--config", str(config))) as running:
        yield running


def test_bark_is_listed_with_its_voices_beside_the_other_model(server) -> None:
    models = httpx.get(f"{server.url}/v1/models").json()["data"]
    assert [m["id"] for m in models] == ["cadenza-tiny", "bark-tiny"]
    assert models[1]["voices"] == ["default", SHORT_VOICE, VOICE]
    assert models[1]["sample_rate"] == 24000
    capacity = httpx.get(f"{server.url}/v1/capacity").json()
    assert set(capacity["models"]) == {"cadenza-tiny", "bark-tiny"}


def test_http_audio_equals_the_offline_path(server, offline) -> None:
    body = {
        "model": "bark-tiny",
        "input": TEXT,
        "voice": VOICE,
        "response_format": "pcm",
        "max_duration_s": 1.0,
        "temperature": 0.0,
    }
    response = httpx.post(f"{server.url}/v1/audio/speech", json=body, timeout=120)
    assert response.status_code == 200, response.text
    served = np.frombuffer(response.content, dtype="<i2").astype(np.int32)
    expected = (np.clip(offline(TEXT, VOICE, 1.0), -1.0, 1.0) * 32767.0).round().astype(np.int32)
    assert served.size == expected.size > 0
    assert np.abs(served - expected).max() <= 1
    wait_until_idle(server)


def test_a_text_of_three_sentences_is_spoken_sentence_by_sentence(server, offline) -> None:
    """Bark's long-form recipe: each sentence its own generation, one after the other, the
    stream's first audio after the first sentence; the audio is each sentence's, in order."""
    sentences = ["hello world.", "the quick brown fox!", "jumps over the lazy dog?"]
    body = {
        "model": "bark-tiny",
        "input": " ".join(sentences),
        "voice": VOICE,
        "response_format": "pcm",
        "max_duration_s": 0.4,
        "temperature": 0.0,
    }
    response = httpx.post(f"{server.url}/v1/audio/speech", json=body, timeout=120)
    assert response.status_code == 200, response.text
    served = np.frombuffer(response.content, dtype="<i2").astype(np.int32)
    spoken = np.concatenate([offline(sentence, VOICE, 0.4) for sentence in sentences])
    expected = (np.clip(spoken, -1.0, 1.0) * 32767.0).round().astype(np.int32)
    assert served.size == expected.size > 0
    assert np.abs(served - expected).max() <= 1

    async def segments() -> list[str]:
        said = []
        async with connect(server.url.replace("http", "ws") + "/v1/stream") as session:
            await session.connection.send(
                json.dumps({"type": "speak", "text": body["input"], "model": "bark-tiny",
                            "voice": VOICE, "max_duration_s": 0.2})
            )  # fmt: skip
            while True:
                message = await session.connection.recv()
                if isinstance(message, bytes):
                    continue
                event = json.loads(message)
                if event["type"] == "segment":
                    said.append(event["text"])
                if event["type"] == "done":
                    return said

    assert asyncio.run(segments()) == sentences
    wait_until_idle(server)


def test_websocket_and_webrtc_stream_bark(server) -> None:
    async def main() -> tuple[int, dict]:
        async with connect(server.url.replace("http", "ws") + "/v1/stream") as session:
            chunks = [
                c
                async for c in session.speak(
                    TEXT,
                    model="bark-tiny",
                    voice=SHORT_VOICE,
                    max_duration_s=1.0,
                    seed=3,
                    fine_temperature=0.3,
                )
            ]
        peer = WebRTCPeer(server.url)
        try:
            await peer.connect()
            peer.send(
                {"type": "speak", "text": TEXT, "model": "bark-tiny", "voice": VOICE,
                 "max_duration_s": 0.5}
            )  # fmt: skip
            done = await peer.next_event({"done", "error"}, timeout_s=120)
        finally:
            await peer.close()
        return sum(len(c.data) for c in chunks), done

    pcm_bytes, done = asyncio.run(main())
    assert pcm_bytes > 0
    assert done["type"] == "done", done
    wait_until_idle(server)


def test_a_text_stream_speaks_more_than_bark_reads_at_once(server) -> None:
    sentence = "the quick brown fox jumps over the lazy dog and the world. "
    words = (sentence * 30).split()  # 360 tokens: more than one Bark prompt takes

    async def words_arriving():
        for word in words:
            yield word + " "

    async def main() -> tuple[int, list[str]]:
        async with connect(server.url.replace("http", "ws") + "/v1/stream") as session:
            chunks = [
                c
                async for c in session.speak_stream(
                    words_arriving(), model="bark-tiny", voice=VOICE, max_duration_s=0.3,
                    temperature=0.0,
                )
            ]  # fmt: skip
            return len(chunks), list(session.segments)

    chunks, segments = asyncio.run(main())
    assert chunks > 0 and len(segments) > 1
    assert " ".join(segments).split() == words
    wait_until_idle(server)


def test_what_bark_cannot_do_is_refused_with_the_reason(server) -> None:
    speech = f"{server.url}/v1/audio/speech"
    base = {"model": "bark-tiny", "input": TEXT, "voice": VOICE, "max_duration_s": 0.5}
    response = httpx.post(speech, json=base | {"voice": "tara"}, timeout=60)
    assert response.status_code == 400 and VOICE in response.json()["error"]["message"]
    response = httpx.post(speech, json=base | {"input": "   "}, timeout=60)
    assert response.status_code == 400
    tiny = base | {"model": "cadenza-tiny", "voice": "default", "fine_temperature": 0.5}
    response = httpx.post(speech, json=tiny, timeout=60)
    error = response.json()["error"]
    assert response.status_code == 400 and error["code"] == "unsupported_sampling_field"
    assert error["param"] == "fine_temperature"
    response = httpx.post(speech, json=base | {"guidance_scale": 3.0}, timeout=60)
    error = response.json()["error"]
    assert response.status_code == 400 and error["code"] == "unsupported_sampling_field"
    assert error["param"] == "guidance_scale" and "fine_temperature" in error["message"]
    response = httpx.post(speech, json=base | {"fine_temperature": -1}, timeout=60)
    assert response.status_code == 400
    # Longer than one segment and no sentence end: cut at the length limit (so no segment
    # exceeds what Bark reads at once) and spoken segment by segment.
    response = httpx.post(speech, json=base | {"input": "word " * 60, "max_duration_s": 0.1})
    assert response.status_code == 200 and len(response.content) > 0

    async def refused_over_websocket() -> str:
        async with connect(server.url.replace("http", "ws") + "/v1/stream") as session:
            with pytest.raises(StreamError) as refused:
                async for _ in session.speak(
                    TEXT, model="bark-tiny", voice=VOICE, guidance_scale=3.0
                ):
                    pass
            return str(refused.value)

    assert "guidance_scale" in asyncio.run(refused_over_websocket())
    wait_until_idle(server)


@pytest.fixture(scope="module")
def small_windows_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("bark-small-windows") / "bark-tiny"
    build_tiny_bark(directory, small_windows=True)
    return directory


@pytest.fixture(scope="module")
def replicated(small_windows_dir, tmp_path_factory):
    """Two engine replicas of a Bark checkpoint whose fine windows are short (a stream's first
    chunk is one fine window; several follow)."""
    root = tmp_path_factory.mktemp("bark-replicated")
    config = root / "cadenza.toml"
    config.write_text(f'[[models]]\nname = "bark-tiny"\npath = "{small_windows_dir}"\n')
    env = {"CADENZA_SUPERVISION__REPLICAS": "2"}
    with serving(root / "server.log", env, args=("--config", str(config))) as running:
        yield running


def _serving_pid(server) -> int:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        models = httpx.get(f"{server.url}/admin/replicas", timeout=10).json()["models"]
        busy = [r["pid"] for r in models["bark-tiny"] if r["streams"]]
        if busy:
            return busy[0]
        time.sleep(0.02)
    raise AssertionError("no replica holds the stream")


def test_a_stream_whose_engine_dies_goes_on_from_what_it_had_heard(
    replicated, small_windows_dir
) -> None:
    """Killed after its first chunk (its first fine window), the stream is generated again on
    the other replica (its outputs carried no rows: it resumes from the frames heard) and its
    listener hears the rest, no sample twice."""
    text = "hello world the quick brown fox jumps over lazy dog"
    engine = Engine.from_pretrained(str(small_windows_dir))
    greedy = SamplingParams(temperature=0.0)
    audio = synthesize(engine, text, voice=VOICE, max_duration_s=4.0, sampling=greedy)
    expected = (np.clip(audio, -1.0, 1.0) * 32767.0).round().astype(np.int32)
    metric = 'cadenza_stream_resumes_total{model="bark-tiny",outcome="resumed"'
    resumes = replicated.metric(metric)

    async def main() -> bytes:
        received = b""
        async with connect(replicated.url.replace("http", "ws") + "/v1/stream") as session:
            async for chunk in session.speak(
                text, model="bark-tiny", voice=VOICE, max_duration_s=4.0, temperature=0.0
            ):
                if not received:
                    os.kill(await asyncio.to_thread(_serving_pid, replicated), signal.SIGKILL)
                received += chunk.data
        return received

    heard = np.frombuffer(asyncio.run(main()), dtype="<i2").astype(np.int32)
    assert heard.size == expected.size
    assert np.abs(heard - expected).max() <= 1
    assert replicated.metric(metric) == resumes + 1
    wait_until_idle(replicated)


def test_plan_prices_one_context_and_measures_bark_on_the_engine(bark_dir) -> None:
    env = {**os.environ, "CADENZA_CALIBRATION__BATCH_SIZES": "[1, 2]"}  # a short sweep
    completed = subprocess.run(
        [sys.executable, "-m", "cadenza", "plan", "--model", str(bark_dir), "--json",
         "--memory", "1GiB", "--context", "1025"],
        capture_output=True, text=True, timeout=300, check=True, env=env,
    )  # fmt: skip
    plan = json.loads(completed.stdout)
    assert plan["kv_bytes_per_token"] == 2 * 2 * 2 * 16 * 2  # K and V, layers, heads, dim, bf16
    assert plan["state_bytes_per_sequence"] > 0  # its progress through the stages
    realtime = plan["realtime"]
    assert realtime["calibration_consistent"] and realtime["max_streams_per_replica"] >= 1
    assert set(realtime["decode_step_ms"]) == {"1", "2"}
