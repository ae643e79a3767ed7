"""The official ``openai`` SDK against the real server: every speech call it offers (whole,
streamed, SSE, raw, async) works unchanged, OpenAI's fields the models do not use are accepted
and named in ``X-Cadenza-Ignored-Fields``, and refusals arrive as the SDK's own exceptions
carrying the server's code and message."""

from __future__ import annotations

import asyncio
import base64
import io
import json
from collections.abc import Iterable
from typing import Any

import av
import openai
import pytest

from cadenza.edge.media.containers import OPENAI_FORMATS
from tests.integration.server import serving

MODEL = "cadenza-tiny"
HOP = 320  # samples per codec frame of the tiny model
SAMPLE_RATE = 24000
IGNORED_HEADER = "x-cadenza-ignored-fields"

# The first bytes of each container the server writes (opus: Ogg; aac: ADTS, MPEG-4).
MAGIC = {"mp3": b"ID3", "opus": b"OggS", "aac": b"\xff\xf1", "flac": b"fLaC", "wav": b"RIFF"}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with serving(tmp_path_factory.mktemp("server") / "server.log") as running:
        yield running


@pytest.fixture(scope="module")
def client(server):
    with openai.OpenAI(
        base_url=f"{server.url}/v1", api_key="x", max_retries=0, timeout=60
    ) as sdk_client:
        yield sdk_client


def _pcm_seconds(pcm: bytes) -> float:
    return len(pcm) / 2 / SAMPLE_RATE


def _decoded_seconds(audio: bytes) -> float:
    container = av.open(io.BytesIO(audio), mode="r")
    samples, rate = 0, SAMPLE_RATE
    for frame in container.decode(container.streams.audio[0]):
        samples, rate = samples + frame.samples, frame.sample_rate
    return samples / rate


def _sse_events(lines: Iterable[str]) -> list[dict[str, Any]]:
    return [json.loads(line[len("data: ") :]) for line in lines if line.startswith("data: ")]


# -- whole responses --------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", OPENAI_FORMATS)
def test_create_returns_each_format_whole(client, fmt):
    speech = client.audio.speech.create(
        model=MODEL, voice="default", input="x" * 28, response_format=fmt
    )
    audio = speech.content
    if fmt == "pcm":
        assert speech.response.headers["content-type"] == "audio/pcm"
        assert len(audio) == 150 * HOP * 2  # 28 chars at 14 a second: 2 s, s16le
        return
    assert audio.startswith(MAGIC[fmt]), audio[:8]
    assert fmt != "wav" or audio[8:12] == b"WAVE"
    assert abs(_decoded_seconds(audio) - 2.0) <= 0.25


def test_default_format_is_mp3(client):
    speech = client.audio.speech.create(model=MODEL, voice="default", input="hello")
    assert speech.response.headers["content-type"] == "audio/mpeg"
    assert speech.content.startswith(MAGIC["mp3"])


def test_instructions_are_accepted_and_named_as_ignored(client):
    raw = client.audio.speech.with_raw_response.create(
        model=MODEL,
        voice="default",
        input="hello",
        instructions="Speak cheerfully.",
        response_format="pcm",
        extra_body={"seed": 5},
    )
    assert raw.status_code == 200 and raw.headers[IGNORED_HEADER] == "instructions"
    plain = client.audio.speech.with_raw_response.create(
        model=MODEL, voice="default", input="hello", response_format="pcm", extra_body={"seed": 5}
    )
    assert IGNORED_HEADER not in plain.headers
    assert raw.parse().content == plain.parse().content  # the instructions changed nothing


def test_a_voice_object_names_the_voice(client):
    by_object = client.audio.speech.create(
        model=MODEL,
        voice={"id": "default"},
        input="hello",
        response_format="pcm",
        extra_body={"seed": 6},
    )
    by_name = client.audio.speech.create(
        model=MODEL, voice="default", input="hello", response_format="pcm", extra_body={"seed": 6}
    )
    assert by_object.content == by_name.content


@pytest.mark.parametrize("speed", [0.5, 2.0])
def test_speed_changes_the_duration(client, speed):
    speech = client.audio.speech.create(
        model=MODEL,
        voice="default",
        input="x" * 28,
        response_format="pcm",
        speed=speed,
        instructions="Speak quickly.",
    )
    expected_s = 2.0 / speed
    assert abs(_pcm_seconds(speech.content) - expected_s) < 0.05 * expected_s


# -- streamed ---------------------------------------------------------------------------------


def test_streaming_response_yields_the_audio_as_it_comes(client):
    request = {"model": MODEL, "voice": "default", "input": "x" * 28, "response_format": "pcm"}
    with client.audio.speech.with_streaming_response.create(
        **request, extra_body={"seed": 7}
    ) as response:
        assert response.headers["content-type"] == "audio/pcm"
        chunks = list(response.iter_bytes())
    assert len(chunks) > 1  # engine chunk by engine chunk, not one body at the end
    streamed = b"".join(chunks)
    assert streamed == client.audio.speech.create(**request, extra_body={"seed": 7}).content
    assert len(streamed) == 150 * HOP * 2  # 2 s


def test_sse_events_carry_the_same_audio(client):
    with client.audio.speech.with_streaming_response.create(
        model=MODEL,
        voice="default",
        input="x" * 28,
        response_format="pcm",
        stream_format="sse",
        instructions="Speak slowly.",
        extra_body={"seed": 8},
    ) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        assert response.headers[IGNORED_HEADER] == "instructions"
        events = _sse_events(response.iter_lines())
    assert [e["type"] for e in events[:-1]] == ["speech.audio.delta"] * (len(events) - 1)
    assert len(events) > 1 and events[-1]["type"] == "speech.audio.done"
    audio = b"".join(base64.b64decode(e["audio"]) for e in events[:-1])
    assert events[-1]["usage"]["audio_bytes"] == len(audio)
    whole = client.audio.speech.create(
        model=MODEL, voice="default", input="x" * 28, response_format="pcm", extra_body={"seed": 8}
    )
    assert audio == whole.content


def test_async_client_streams_and_reads_whole(server):
    async def main(url: str) -> tuple[bytes, bytes, str]:
        async with openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0) as sdk:
            whole = await sdk.audio.speech.create(
                model=MODEL,
                voice="default",
                input="x" * 28,
                response_format="pcm",
                instructions="Speak warmly.",
                extra_body={"seed": 9},
            )
            async with sdk.audio.speech.with_streaming_response.create(
                model=MODEL,
                voice="default",
                input="x" * 28,
                response_format="pcm",
                instructions="Speak warmly.",
                extra_body={"seed": 9},
            ) as response:
                streamed = b"".join([chunk async for chunk in response.iter_bytes()])
                ignored = response.headers[IGNORED_HEADER]
            return whole.content, streamed, ignored

    whole, streamed, ignored = asyncio.run(main(server.url))
    assert len(whole) == 150 * HOP * 2 and streamed == whole
    assert ignored == "instructions"


# -- refusals ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "code", "param", "said"),
    [
        ({"voice": "alloy"}, "voice_not_found", "voice", "voice 'alloy' is not available"),
        ({"voice": {"id": "voice_1234"}}, "voice_not_found", "voice", "'voice_1234'"),
        ({"voice": {"name": "alloy"}}, "invalid_value", "voice", 'voice object must be {"id"'),
        ({"input": ""}, "empty_input", "input", "input must not be empty"),
        ({"model": "tts-1"}, "model_not_found", "model", "available: 'cadenza-tiny'"),
        ({"instructions": "x" * 4097}, "invalid_value", "instructions", "at most 4096"),
        ({"speed": 9.0}, "invalid_value", "speed", "speed: "),
        ({"extra_body": {"user": "someone"}}, "unknown_field", "user", "user: Extra inputs"),
    ],
)
def test_refusals_raise_the_sdks_bad_request_error(client, fields, code, param, said):
    request = {"model": MODEL, "voice": "default", "input": "hello", **fields}
    with pytest.raises(openai.BadRequestError) as caught:
        client.audio.speech.create(**request)
    error = caught.value
    assert (error.status_code, error.code, error.param) == (400, code, param)
    assert error.type == "invalid_request_error"
    assert isinstance(error.body, dict) and said in error.body["message"]


def test_the_async_client_raises_the_same_error(server):
    async def main(url: str) -> openai.BadRequestError:
        async with openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0) as sdk:
            with pytest.raises(openai.BadRequestError) as caught:
                await sdk.audio.speech.create(model=MODEL, voice="alloy", input="hello")
            return caught.value

    assert asyncio.run(main(server.url)).code == "voice_not_found"


def test_models_list_names_the_served_model(client):
    assert [model.id for model in client.models.list()] == [MODEL]
