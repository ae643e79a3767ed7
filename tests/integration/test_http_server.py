"""The real server in its own process (engine in a child process), driven over HTTP."""

from __future__ import annotations

import base64
import io
import json
import time
import wave
from concurrent.futures import ThreadPoolExecutor

import av
import httpx
import pytest

from tests.integration.server import serving

HOP = 320
SPEECH = "/v1/audio/speech"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with serving(tmp_path_factory.mktemp("server") / "server.log") as running:
        yield running


@pytest.fixture
def http(server):
    with httpx.Client(base_url=server.url, timeout=60) as client:
        yield client


def _speech(text, **fields):
    return {"model": "cadenza-tiny", "input": text, "voice": "default", **fields}


def _wav_samples(body: bytes) -> int:
    with wave.open(io.BytesIO(body)) as reader:
        assert (reader.getframerate(), reader.getnchannels(), reader.getsampwidth()) == (
            24000,
            1,
            2,
        )
        return len(reader.readframes(10**9)) // 2


def _metric(http, name: str) -> float:
    text = http.get("/metrics").text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(name) and not line.startswith("#")
    )


def test_health_ready_models(http):
    assert http.get("/healthz").json() == {"status": "ok"}
    ready = http.get("/readyz")
    assert ready.status_code == 200 and ready.json()["status"] == "ready"
    kernels = ready.json()["models"]["cadenza-tiny"]["replicas"][0]["native_kernels"]
    assert kernels["summary"].startswith("native kernels:")  # loaded or not, and why
    assert {"status", "level", "isa"} <= set(kernels["libraries"]["cpu_elu"])
    assert "cadenza_native_kernel_loaded{" in http.get("/metrics").text
    models = http.get("/v1/models").json()
    assert models["object"] == "list"
    assert models["data"][0]["id"] == "cadenza-tiny"
    assert models["data"][0]["voices"] == ["default"]


def test_wav_has_the_duration_derived_from_text(http):
    response = http.post(SPEECH, json=_speech("x" * 42, response_format="wav", seed=1))
    assert response.status_code == 200
    assert response.headers["content-type"] == "audio/wav"
    assert response.headers.get("transfer-encoding") == "chunked"
    assert _wav_samples(response.content) == 225 * HOP  # 42 chars / 14 per s = 3 s


def test_pcm_length_and_seed_reproducibility(http):
    first = http.post(SPEECH, json=_speech("hello", response_format="pcm", seed=9))
    second = http.post(SPEECH, json=_speech("hello", response_format="pcm", seed=9))
    assert first.status_code == 200 and first.headers["content-type"] == "audio/pcm"
    assert len(first.content) == 75 * HOP * 2  # 1 s minimum, s16le
    assert first.content == second.content


def test_max_duration_caps_the_audio(http):
    response = http.post(SPEECH, json=_speech("x" * 200, max_duration_s=0.4, response_format="pcm"))
    assert len(response.content) == 30 * HOP * 2


@pytest.mark.parametrize("fmt", ["mp3", "opus", "aac", "flac", "wav"])
def test_every_container_decodes_with_the_expected_duration(http, fmt):
    response = http.post(SPEECH, json=_speech("x" * 28, response_format=fmt, seed=4))
    assert response.status_code == 200
    container = av.open(io.BytesIO(response.content))
    samples, rate = 0, 0
    for frame in container.decode(container.streams.audio[0]):
        samples, rate = samples + frame.samples, frame.sample_rate
    assert abs(samples / rate - 2.0) <= 0.25  # 28 chars at 14 per second


@pytest.mark.parametrize("speed", [0.5, 2.0])
def test_speed_changes_the_duration(http, speed):
    body = _speech("x" * 28, response_format="pcm", speed=speed, seed=2)
    response = http.post(SPEECH, json=body)
    assert response.status_code == 200
    seconds = len(response.content) / 2 / 24000
    assert abs(seconds - 2.0 / speed) < 0.05 * 2.0 / speed


def test_sse_stream_format(http):
    body = _speech("x" * 28, response_format="pcm", stream_format="sse", seed=2, priority="batch")
    response = http.post(SPEECH, json=body)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    events = [
        json.loads(line[len("data: ") :])
        for line in response.text.splitlines()
        if line.startswith("data: ")
    ]
    assert [e["type"] for e in events[:-1]] == ["speech.audio.delta"] * (len(events) - 1)
    assert events[-1]["type"] == "speech.audio.done"
    audio = b"".join(base64.b64decode(e["audio"]) for e in events[:-1])
    plain = http.post(SPEECH, json=_speech("x" * 28, response_format="pcm", seed=2))
    assert audio == plain.content


def test_default_format_is_mp3(http):
    response = http.post(SPEECH, json={"model": "cadenza-tiny", "input": "hello"})
    assert response.status_code == 200 and response.headers["content-type"] == "audio/mpeg"


def test_audio_streams_in_chunks(http):
    with http.stream("POST", SPEECH, json=_speech("x" * 56, response_format="pcm")) as response:
        sizes = [len(piece) for piece in response.iter_raw()]
    assert len(sizes) > 3
    assert sum(sizes) == 300 * HOP * 2


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        (b"{not json", 400, "invalid_json"),
        (b"\xff\xfe", 400, "invalid_json"),
        (b"[1, 2]", 400, "invalid_json"),
        (b'{"model": "cadenza-tiny"}', 400, "invalid_value"),
        (b'{"model": "cadenza-tiny", "input": 5}', 400, "invalid_value"),
        (b'{"model": "tts-1", "input": "hi"}', 400, "model_not_found"),
        (b'{"model": "cadenza-tiny", "input": "hi", "voice": "alloy"}', 400, "voice_not_found"),
        (
            b'{"model": "cadenza-tiny", "input": "hi", "response_format": "ogg"}',
            400,
            "invalid_value",
        ),
        (b'{"model": "cadenza-tiny", "input": "hi", "speed": 9.0}', 400, "invalid_value"),
        (b'{"model": "cadenza-tiny", "input": "hi", "priority": "vip"}', 400, "invalid_value"),
        (b'{"model": "cadenza-tiny", "input": "hi", "bogus": 1}', 400, "unknown_field"),
        (
            b'{"model": "cadenza-tiny", "input": "hi", "max_duration_s": -1}',
            400,
            "invalid_duration",
        ),
        (b'{"model": "cadenza-tiny", "input": ""}', 400, "empty_input"),
    ],
)
def test_bad_requests_get_openai_errors(http, body, status, code):
    response = http.post(SPEECH, content=body, headers={"content-type": "application/json"})
    assert response.status_code == status
    error = response.json()["error"]
    assert error["code"] == code
    assert error["message"] and error["type"]


def test_oversize_input_and_body(http):
    too_long = http.post(SPEECH, json=_speech("x" * 4097))
    assert too_long.status_code == 400 and too_long.json()["error"]["code"] == "input_too_long"
    huge = http.post(SPEECH, content=b"{" + b" " * 70_000 + b"}")
    assert huge.status_code == 413 and huge.json()["error"]["code"] == "body_too_large"
    unknown_route = http.get("/v1/nothing")
    assert unknown_route.status_code == 404 and unknown_route.json()["error"]["code"] == "not_found"
    # and the server keeps serving
    assert http.post(SPEECH, json=_speech("still here", response_format="pcm")).status_code == 200


def test_eight_concurrent_requests_are_batched(server, http):
    texts = ["x" * n for n in (14, 28, 42, 20, 35, 14, 56, 30)]

    def one(text):
        with httpx.Client(base_url=server.url, timeout=120) as client:
            return client.post(SPEECH, json=_speech(text, response_format="wav"))

    with ThreadPoolExecutor(len(texts)) as pool:
        responses = list(pool.map(one, texts))
    expected = [round(max(len(t) / 14, 1) * 75) * HOP for t in texts]
    assert [r.status_code for r in responses] == [200] * len(texts)
    assert [_wav_samples(r.content) for r in responses] == expected
    time.sleep(0.6)  # the engine's stats arrive every 0.5 s
    steps = _metric(http, "cadenza_engine_step_decode_tokens_count")
    single = _metric(
        http, 'cadenza_engine_step_decode_tokens_bucket{model="cadenza-tiny",le="1.0",'
    )
    batched = steps - single
    assert batched > 0, "no engine step decoded more than one stream"


def test_client_that_disconnects_frees_its_stream(http, server):
    cancelled_before = _metric(
        http, 'cadenza_streams_finished_total{reason="cancelled",transport="http",'
    )
    with (
        httpx.Client(base_url=server.url, timeout=60) as client,
        client.stream(
            "POST", SPEECH, json=_speech("x" * 2000, max_duration_s=60, response_format="pcm")
        ) as response,
    ):
        next(response.iter_raw())  # audio is flowing; now hang up
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        idle = http.get("/readyz").json()["streams"] == 0
        engine_idle = _metric(http, "cadenza_engine_requests") == 0
        cancelled = _metric(
            http, 'cadenza_streams_finished_total{reason="cancelled",transport="http",'
        )
        if idle and engine_idle and cancelled > cancelled_before:
            break
        time.sleep(0.2)
    else:
        pytest.fail("the disconnected stream was not cancelled and freed")


def test_metrics_report_engine_steps_and_first_audio(http):
    http.post(SPEECH, json=_speech("metrics", response_format="pcm"))
    time.sleep(0.6)  # engine stats arrive every 0.5 s
    assert _metric(http, "cadenza_engine_step_seconds_count") > 0
    assert _metric(http, "cadenza_time_to_first_audio_seconds_count") > 0
    assert _metric(http, 'cadenza_http_requests_total{route="/v1/audio/speech",status="200",') > 0
    # The audio's way out is watched: engine outputs read by the edge, the edge's own loop.
    assert _metric(http, "cadenza_engine_output_delay_seconds_count") > 0
    assert _metric(http, "cadenza_edge_loop_lag_seconds_count") > 0
