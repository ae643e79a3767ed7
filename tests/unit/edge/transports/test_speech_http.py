"""The body of ``POST /v1/audio/speech``: :func:`parse_speech_request` takes every field of
OpenAI's request (those no model uses are named by ``ignored_fields``), fills OpenAI's defaults
and refuses everything else with a 400 :class:`EdgeError` (``invalid_json``, ``unknown_field``
or ``invalid_value`` with its ``param``), whatever bytes arrive."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cadenza.edge.streams.errors import EdgeError
from cadenza.edge.streams.untrusted_json import MAX_DEPTH
from cadenza.edge.transports.speech_http import (
    IGNORED_OPENAI_FIELDS,
    MAX_INSTRUCTIONS_CHARS,
    SpeechRequest,
    parse_speech_request,
)

CODES = {"invalid_json", "unknown_field", "invalid_value"}
FIELDS = tuple(SpeechRequest.model_fields)


def body(**fields: Any) -> bytes:
    return json.dumps({"model": "cadenza-tiny", "input": "Hello.", **fields}).encode()


def refusal(raw: bytes) -> EdgeError:
    with pytest.raises(EdgeError) as caught:
        parse_speech_request(raw)
    error = caught.value
    assert error.status == 400 and error.code in CODES
    assert error.message and error.retry_after_s is None and "Retry-After" not in error.headers
    return error


# -- accepted ---------------------------------------------------------------------------------


def test_a_minimal_body_gets_the_defaults() -> None:
    assert parse_speech_request(body()) == SpeechRequest(
        model="cadenza-tiny",
        input="Hello.",
        voice="default",
        instructions=None,
        response_format="mp3",
        speed=1.0,
        stream_format="audio",
        seed=None,
        max_duration_s=None,
        priority="standard",
    )


def test_every_field_is_kept() -> None:
    request = parse_speech_request(
        body(
            voice="alto",
            response_format="wav",
            speed=0.25,
            stream_format="sse",
            seed=2**63 - 1,
            max_duration_s=12.5,
            priority="realtime",
        )
    )
    assert (request.voice, request.response_format, request.speed) == ("alto", "wav", 0.25)
    assert (request.stream_format, request.seed) == ("sse", 2**63 - 1)
    assert (request.max_duration_s, request.priority) == (12.5, "realtime")


@pytest.mark.parametrize("response_format", ["mp3", "opus", "aac", "flac", "wav", "pcm"])
def test_every_openai_response_format_is_accepted(response_format: str) -> None:
    assert parse_speech_request(body(response_format=response_format)).response_format == (
        response_format
    )


def test_a_minimal_body_ignores_nothing() -> None:
    assert parse_speech_request(body()).ignored_fields() == []


@pytest.mark.parametrize("instructions", ["Speak cheerfully.", "x" * MAX_INSTRUCTIONS_CHARS])
def test_instructions_are_accepted_and_named_as_ignored(instructions: str) -> None:
    request = parse_speech_request(body(instructions=instructions))
    assert request.instructions == instructions
    assert request.ignored_fields() == ["instructions"]


@pytest.mark.parametrize("instructions", [None, ""])
def test_instructions_that_ask_nothing_are_not_ignored(instructions: str | None) -> None:
    assert parse_speech_request(body(instructions=instructions)).ignored_fields() == []


def test_openai_voice_object_names_the_voice() -> None:
    assert parse_speech_request(body(voice={"id": "alto"})).voice == "alto"


def test_every_field_of_the_openai_sdk_request_is_accepted() -> None:
    # The body openai's client.audio.speech.create(...) sends with every argument given.
    request = parse_speech_request(
        body(
            model="cadenza-tiny",
            voice={"id": "alto"},
            instructions="Speak cheerfully.",
            response_format="opus",
            speed=1.5,
            stream_format="sse",
        )
    )
    assert (request.voice, request.response_format, request.speed) == ("alto", "opus", 1.5)
    assert request.stream_format == "sse" and request.ignored_fields() == ["instructions"]


def test_speed_bounds_are_inclusive() -> None:
    assert parse_speech_request(body(speed=4)).speed == 4.0
    assert parse_speech_request(body(speed=0.25)).speed == 0.25


def test_non_ascii_input_arrives_intact() -> None:
    assert parse_speech_request(body(input="Grüße 😀")).input == "Grüße 😀"


# -- refused ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "raw",
    [
        b"",
        b"not json",
        b'{"model": "m", "input": "unterminated',
        b"\xff\xfe{}",
        b'{"model": "m", "input": "caf\xe9"}',
    ],
)
def test_a_body_that_is_not_json_is_invalid_json(raw: bytes) -> None:
    error = refusal(raw)
    assert error.code == "invalid_json" and error.message.startswith("request body: ")
    assert error.param is None


@pytest.mark.parametrize("raw", [b"[]", b'"speak"', b"42", b"null", b'[{"model": "m"}]'])
def test_a_body_that_is_not_an_object_is_invalid_json(raw: bytes) -> None:
    error = refusal(raw)
    assert error.code == "invalid_json" and "JSON object" in error.message


@pytest.mark.parametrize(
    "raw",
    [
        b'{"model": "m", "input": "x", "voice": '
        + b"[" * (MAX_DEPTH + 1)
        + b"]" * (MAX_DEPTH + 1)
        + b"}",
        b'{"model": "m", "input": "x", "seed": ' + b"1" * 40 + b"}",
        b'{"model": "m", "input": "\\ud800"}',
        b'{"model": "m", "input": "x", "\\udc00": 1}',
        b'{"model": "m", "input": "x", "speed": NaN}',
        b'{"model": "m", "input": "x", "speed": Infinity}',
        b'{"model": "m", "input": "x", "max_duration_s": 1e999}',
        b"[" * 100_000,
    ],
)
def test_bodies_the_json_policy_refuses_are_invalid_json(raw: bytes) -> None:
    assert refusal(raw).code == "invalid_json"


@pytest.mark.parametrize("field", ["instruction", "Instructions", "Model", "stream", "user", ""])
def test_an_unknown_field_is_named(field: str) -> None:
    error = refusal(body(**{field: "x"}))
    assert error.code == "unknown_field"
    assert error.param == (field or None)


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"model": None}, "model"),
        ({"model": 3}, "model"),
        ({"input": None}, "input"),
        ({"input": ["Hello."]}, "input"),
        ({"voice": 1}, "voice"),
        ({"voice": ["alto"]}, "voice"),
        ({"voice": {}}, "voice"),
        ({"voice": {"id": 1}}, "voice"),
        ({"voice": {"id": None}}, "voice"),
        ({"voice": {"name": "alto"}}, "voice"),
        ({"voice": {"id": "alto", "name": "alto"}}, "voice"),
        ({"instructions": 5}, "instructions"),
        ({"instructions": True}, "instructions"),
        ({"instructions": ["Speak cheerfully."]}, "instructions"),
        ({"instructions": {"tone": "cheerful"}}, "instructions"),
        ({"instructions": "x" * (MAX_INSTRUCTIONS_CHARS + 1)}, "instructions"),
        ({"response_format": "ogg"}, "response_format"),
        ({"response_format": "MP3"}, "response_format"),
        ({"speed": 0.2}, "speed"),
        ({"speed": 4.01}, "speed"),
        ({"speed": "fast"}, "speed"),
        ({"speed": True}, "speed"),
        ({"speed": "1.5"}, "speed"),
        ({"stream_format": "chunked"}, "stream_format"),
        ({"seed": -1}, "seed"),
        ({"seed": 2**63}, "seed"),
        ({"seed": 1.5}, "seed"),
        ({"max_duration_s": "forever"}, "max_duration_s"),
        ({"priority": "urgent"}, "priority"),
        ({"temperature": -0.1}, "temperature"),
        ({"temperature": "hot"}, "temperature"),
        ({"top_k": -1}, "top_k"),
        ({"top_p": 0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"min_p": 1}, "min_p"),
        ({"repetition_penalty": 0}, "repetition_penalty"),
        ({"fine_temperature": -1}, "fine_temperature"),
        ({"guidance_scale": -0.5}, "guidance_scale"),
        ({"guidance_scale": 101}, "guidance_scale"),
        ({"guidance_scale": "strong"}, "guidance_scale"),
        ({"stop_token_ids": [-1]}, "stop_token_ids.0"),
        ({"stop_token_ids": "128258"}, "stop_token_ids"),
        ({"stop_token_ids": list(range(17))}, "stop_token_ids"),
    ],
)
def test_bad_values_are_invalid_value_with_their_param(fields: dict[str, Any], param: str) -> None:
    error = refusal(body(**fields))
    assert error.code == "invalid_value"
    assert error.param == param and error.message.startswith(f"{param}: ")


@pytest.mark.parametrize("missing", ["model", "input"])
def test_a_missing_required_field_is_invalid_value(missing: str) -> None:
    fields = {"model": "cadenza-tiny", "input": "Hello."}
    del fields[missing]
    error = refusal(json.dumps(fields).encode())
    assert error.code == "invalid_value" and error.param == missing


# -- fuzz -------------------------------------------------------------------------------------

leaves = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.sampled_from(["mp3", "sse", "audio", "standard", "batch", "cadenza-tiny", ""])
    | st.text(max_size=10)
)
values = st.recursive(
    leaves,
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=5), children, max_size=3)
    ),
    max_leaves=10,
)
shapes = st.dictionaries(st.sampled_from(FIELDS) | st.text(max_size=8), values, max_size=6)


def check(raw: bytes) -> None:
    try:
        request = parse_speech_request(raw)
    except EdgeError as exc:
        assert exc.status == 400 and exc.code in CODES and exc.message
        if exc.code == "invalid_json":
            assert exc.param is None
    else:
        assert isinstance(request, SpeechRequest)
        assert 0.25 <= request.speed <= 4.0
        assert isinstance(request.voice, str)
        assert set(request.ignored_fields()) <= set(IGNORED_OPENAI_FIELDS)


@settings(max_examples=300, deadline=None)
@given(shapes)
def test_fuzzed_json_bodies_are_parsed_or_refused_with_400(payload: dict[str, Any]) -> None:
    check(json.dumps(payload).encode())


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=80) | st.text(max_size=60).map(str.encode))
def test_fuzzed_bytes_are_parsed_or_refused_with_400(raw: bytes) -> None:
    check(raw)
