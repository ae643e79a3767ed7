"""WebSocket protocol v1 without I/O: every client message type and every error code
:func:`parse_client_message` gives, the sample rate each format allows, the server's messages
(standard JSON, ``retry_after_s`` only when given) and the binary audio frame."""

from __future__ import annotations

import json
import struct
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cadenza.edge.streams.protocol import (
    AUDIO_HEADER,
    AUDIO_MAGIC,
    CLIENT_TYPES,
    PCM_SAMPLE_RATES,
    AudioFrame,
    AudioIn,
    Cancel,
    Close,
    Hello,
    Ping,
    ProtocolError,
    ResetConversation,
    Resume,
    Speak,
    decode_audio_frame,
    encode_audio_frame,
    error_message,
    parse_client_message,
    queued_message,
    resolve_sample_rate,
    server_message,
    wants_spill,
)
from cadenza.edge.streams.untrusted_json import MAX_DEPTH

NATIVE_RATE = 24000
PARSE_CODES = {"invalid_json", "unknown_type", "invalid_message"}


def message(**fields: Any) -> str:
    return json.dumps(fields)


def refused(text: str) -> ProtocolError:
    with pytest.raises(ProtocolError) as caught:
        parse_client_message(text)
    assert caught.value.message == str(caught.value)
    assert caught.value.stream_id is None
    return caught.value


def strict_json(text: str) -> Any:
    """Parse as a browser would: NaN and Infinity are not JSON."""

    def refuse(name: str) -> Any:
        raise AssertionError(f"{name} in server output")

    return json.loads(text, parse_constant=refuse)


# -- client messages --------------------------------------------------------------------------


def test_a_minimal_speak_gets_the_documented_defaults() -> None:
    speak = parse_client_message(message(type="speak", text="Hello."))
    assert speak == Speak(
        type="speak",
        text="Hello.",
        voice="default",
        format="pcm",
        sample_rate=None,
        max_duration_s=None,
        seed=None,
        priority="realtime",
        use_audio_prompt=False,
    )


def test_a_speak_with_every_field_keeps_them() -> None:
    speak = parse_client_message(
        message(
            type="speak",
            text="Hi",
            voice="alto",
            format="opus",
            sample_rate=48000,
            max_duration_s=2.5,
            seed=2**63 - 1,
            priority="batch",
            use_audio_prompt=True,
        )
    )
    assert isinstance(speak, Speak)
    assert (speak.voice, speak.format, speak.sample_rate) == ("alto", "opus", 48000)
    assert (speak.max_duration_s, speak.seed, speak.priority) == (2.5, 2**63 - 1, "batch")
    assert speak.use_audio_prompt is True


def test_audio_in_defaults_to_16_khz_pcm_and_accepts_opus() -> None:
    assert parse_client_message(message(type="audio_in")) == AudioIn(
        type="audio_in", format="pcm", sample_rate=16000
    )
    opus = parse_client_message(message(type="audio_in", format="opus", sample_rate=48000))
    assert opus == AudioIn(type="audio_in", format="opus", sample_rate=48000)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (message(type="hello", api_key="k-123"), Hello(type="hello", api_key="k-123")),
        (message(type="cancel"), Cancel(type="cancel")),
        (
            message(type="resume", token="t" * 32, samples_heard=48000),
            Resume(type="resume", token="t" * 32, samples_heard=48000),
        ),
        (message(type="close"), Close(type="close")),
        (
            message(type="reset_conversation"),
            ResetConversation(type="reset_conversation"),
        ),
        (message(type="ping"), Ping(type="ping", data=None)),
        (
            message(type="ping", data={"t": [1, 2.5, "x"]}),
            Ping(type="ping", data={"t": [1, 2.5, "x"]}),
        ),
    ],
)
def test_the_other_client_messages_parse(text: str, expected: Any) -> None:
    assert parse_client_message(text) == expected


def test_every_client_type_is_covered() -> None:
    assert set(CLIENT_TYPES) == {
        "speak", "audio_in", "hello", "resume", "text", "flush", "text_end", "cancel", "ping",
        "close", "reset_conversation",
    }  # fmt: skip


@pytest.mark.parametrize(
    "text",
    [
        "",
        "not json",
        '{"type": "speak", "text": "unterminated',
        '{"type": "ping", "data": NaN}',
        '{"type": "ping", "data": Infinity}',
        '{"type": "ping", "data": 1e999}',
        '{"type": "ping", "data": ' + "1" * 40 + "}",
        '{"type": "speak", "text": "\\ud800"}',
        '{"type": "ping", "data": ' + "[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1) + "}",
    ],
)
def test_text_the_json_policy_refuses_is_invalid_json(text: str) -> None:
    error = refused(text)
    assert error.code == "invalid_json"
    assert error.message.startswith("message: ")


@pytest.mark.parametrize("text", ["[]", '"speak"', "42", "null", "true", '[{"type": "cancel"}]'])
def test_json_that_is_not_an_object_is_invalid_json(text: str) -> None:
    error = refused(text)
    assert error.code == "invalid_json"
    assert "JSON object" in error.message


@pytest.mark.parametrize(
    "payload",
    [
        {},
        {"text": "hi"},
        {"type": "shout"},
        {"type": "SPEAK"},
        {"type": None},
        {"type": 1},
        {"type": ["speak"]},
        {"type": {"speak": 1}},
    ],
)
def test_a_missing_or_unknown_type_is_unknown_type(payload: dict[str, Any]) -> None:
    error = refused(json.dumps(payload))
    assert error.code == "unknown_type"
    assert "expected one of" in error.message


@pytest.mark.parametrize(
    ("payload", "where"),
    [
        ({"type": "speak"}, "text"),
        ({"type": "speak", "text": 7}, "text"),
        ({"type": "speak", "text": "hi", "loud": True}, "loud"),
        ({"type": "speak", "text": "hi", "format": "wav"}, "format"),
        ({"type": "speak", "text": "hi", "sample_rate": "fast"}, "sample_rate"),
        ({"type": "speak", "text": "hi", "sample_rate": 16000.5}, "sample_rate"),
        ({"type": "speak", "text": "hi", "seed": -1}, "seed"),
        ({"type": "speak", "text": "hi", "seed": 2**63}, "seed"),
        ({"type": "speak", "text": "hi", "seed": 0.5}, "seed"),
        ({"type": "speak", "text": "hi", "priority": "urgent"}, "priority"),
        ({"type": "speak", "text": "hi", "max_duration_s": "long"}, "max_duration_s"),
        ({"type": "speak", "text": "hi", "use_audio_prompt": [1]}, "use_audio_prompt"),
        ({"type": "audio_in", "sample_rate": 44100}, "sample_rate"),
        ({"type": "audio_in", "format": "flac"}, "format"),
        ({"type": "audio_in", "channels": 2}, "channels"),
        ({"type": "hello"}, "api_key"),
        ({"type": "hello", "api_key": None}, "api_key"),
        ({"type": "cancel", "stream_id": 1}, "stream_id"),
        ({"type": "resume", "samples_heard": 1}, "token"),
        ({"type": "resume", "token": "short", "samples_heard": 1}, "token"),
        ({"type": "resume", "token": "x" * 31 + "/", "samples_heard": 1}, "token"),
        ({"type": "resume", "token": "x" * 32, "samples_heard": -1}, "samples_heard"),
        ({"type": "resume", "token": "x" * 32, "samples_heard": 1.5}, "samples_heard"),
        ({"type": "resume", "token": "x" * 32, "frames_heard": "9"}, "frames_heard"),
        ({"type": "resume", "token": "x" * 32, "samples_heard": 2**41}, "samples_heard"),
        ({"type": "close", "code": 1000}, "code"),
        ({"type": "ping", "data": 1, "extra": 2}, "extra"),
    ],
)
def test_bad_fields_are_invalid_message_naming_the_field(
    payload: dict[str, Any], where: str
) -> None:
    error = refused(json.dumps(payload))
    assert error.code == "invalid_message"
    assert error.message.startswith(f"{where}: ")


def test_the_seed_range_is_inclusive_of_zero_and_exclusive_of_two_to_the_63() -> None:
    for seed in (0, 2**63 - 1):
        speak = parse_client_message(message(type="speak", text="x", seed=seed))
        assert isinstance(speak, Speak) and speak.seed == seed


# -- sample rates -----------------------------------------------------------------------------


def speak(fmt: str = "pcm", sample_rate: int | None = None) -> Speak:
    return Speak(type="speak", text="x", format=fmt, sample_rate=sample_rate)


@pytest.mark.parametrize(
    ("fmt", "sample_rate", "expected"),
    [
        ("pcm", None, NATIVE_RATE),
        *(("pcm", rate, rate) for rate in PCM_SAMPLE_RATES),
        ("opus", None, 48000),
        ("opus", 48000, 48000),
        ("encodec", None, NATIVE_RATE),
        ("encodec", NATIVE_RATE, NATIVE_RATE),
    ],
)
def test_each_format_resolves_to_its_sample_rate(
    fmt: str, sample_rate: int | None, expected: int
) -> None:
    assert resolve_sample_rate(speak(fmt, sample_rate), NATIVE_RATE) == expected


@pytest.mark.parametrize(
    ("fmt", "sample_rate"),
    [
        ("pcm", 0),
        ("pcm", -16000),
        ("pcm", 44100),
        ("pcm", 8000),
        ("opus", 0),
        ("opus", -48000),
        ("opus", 24000),
        ("encodec", 0),
        ("encodec", -NATIVE_RATE),
        ("encodec", 48000),
    ],
)
def test_rates_a_format_does_not_offer_are_invalid_sample_rate(fmt: str, sample_rate: int) -> None:
    with pytest.raises(ProtocolError) as caught:
        resolve_sample_rate(speak(fmt, sample_rate), NATIVE_RATE)
    assert caught.value.code == "invalid_sample_rate"


def test_codes_are_refused_for_a_model_whose_frames_are_continuous_latents() -> None:
    with pytest.raises(ProtocolError, match="continuous latents") as caught:
        resolve_sample_rate(speak("encodec", None), NATIVE_RATE, codes_as_ids=False)
    assert caught.value.code == "invalid_format"
    assert resolve_sample_rate(speak("pcm", None), NATIVE_RATE, codes_as_ids=False) == 24000


def test_pcm_at_a_native_rate_it_does_not_offer_comes_at_that_rate_only_when_asked() -> None:
    assert resolve_sample_rate(speak("pcm"), 44100) == 48000
    assert resolve_sample_rate(speak("pcm", 44100), 44100) == 44100
    assert resolve_sample_rate(speak("pcm", 16000), 44100) == 16000
    with pytest.raises(ProtocolError) as caught:
        resolve_sample_rate(speak("pcm", 22050), 44100)
    assert caught.value.code == "invalid_sample_rate"


def test_a_parsed_zero_or_negative_sample_rate_is_refused_when_resolved() -> None:
    for rate in (0, -1):
        parsed = parse_client_message(message(type="speak", text="x", sample_rate=rate))
        assert isinstance(parsed, Speak)
        with pytest.raises(ProtocolError) as caught:
            resolve_sample_rate(parsed, NATIVE_RATE)
        assert caught.value.code == "invalid_sample_rate"


# -- server messages --------------------------------------------------------------------------


def test_server_messages_are_standard_json_with_the_type_first() -> None:
    text = server_message("done", stream_id=3, reason="eos", stats={"audio_s": 1.25, "word": "ü"})
    assert text.isascii()
    assert text.startswith('{"type": "done"')
    assert strict_json(text) == {
        "type": "done",
        "stream_id": 3,
        "reason": "eos",
        "stats": {"audio_s": 1.25, "word": "ü"},
    }


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf")])
def test_server_messages_refuse_non_finite_numbers(value: float) -> None:
    with pytest.raises(ValueError):
        server_message("stats", buffer_ms=value)


def test_an_error_without_retry_after_has_no_such_field() -> None:
    assert strict_json(error_message("busy", "an utterance is playing")) == {
        "type": "error",
        "code": "busy",
        "message": "an utterance is playing",
        "stream_id": None,
    }


def test_an_error_with_retry_after_carries_it_rounded_to_a_tenth() -> None:
    error = strict_json(error_message("queue_full", "full", stream_id=4, retry_after_s=2.345))
    assert error == {
        "type": "error",
        "code": "queue_full",
        "message": "full",
        "stream_id": 4,
        "retry_after_s": 2.3,
    }


def test_a_zero_retry_after_is_still_given() -> None:
    assert strict_json(error_message("too_large", "no", retry_after_s=0.0))["retry_after_s"] == 0.0


def test_queued_rounds_the_estimated_wait() -> None:
    assert strict_json(queued_message(2, 1, 3.14159)) == {
        "type": "queued",
        "stream_id": 2,
        "position": 1,
        "estimated_wait_s": 3.1,
    }


# -- audio frames -----------------------------------------------------------------------------


def test_an_audio_frame_has_a_twelve_byte_little_endian_header() -> None:
    frame = encode_audio_frame(1, 2, b"\x01\x02")
    assert AUDIO_HEADER.size == 12
    assert frame == b"CZA1" + b"\x01\x00\x00\x00" + b"\x02\x00\x00\x00" + b"\x01\x02"


@settings(max_examples=100, deadline=None)
@given(
    st.integers(min_value=0, max_value=2**32 - 1),
    st.integers(min_value=0, max_value=2**32 - 1),
    st.binary(max_size=64),
)
def test_audio_frames_round_trip(stream_id: int, index: int, payload: bytes) -> None:
    assert decode_audio_frame(encode_audio_frame(stream_id, index, payload)) == AudioFrame(
        stream_id, index, payload
    )


@pytest.mark.parametrize("data", [b"", b"CZA1", AUDIO_MAGIC + b"\x00" * 7])
def test_a_frame_shorter_than_its_header_is_refused(data: bytes) -> None:
    with pytest.raises(ProtocolError) as caught:
        decode_audio_frame(data)
    assert caught.value.code == "invalid_audio_frame"


@pytest.mark.parametrize("magic", [b"CZA0", b"cza1", b"\x00\x00\x00\x00", b"RIFF"])
def test_a_frame_with_the_wrong_magic_is_refused(magic: bytes) -> None:
    with pytest.raises(ProtocolError) as caught:
        decode_audio_frame(struct.pack("<4sII", magic, 1, 0) + b"\x00\x00")
    assert caught.value.code == "invalid_audio_frame"
    assert "bad magic" in caught.value.message


@settings(max_examples=150, deadline=None)
@given(st.binary(max_size=40))
def test_any_bytes_decode_to_a_frame_or_are_refused(data: bytes) -> None:
    try:
        frame = decode_audio_frame(data)
    except ProtocolError as exc:
        assert exc.code == "invalid_audio_frame"
    else:
        assert encode_audio_frame(frame.stream_id, frame.index, frame.payload) == data


# -- fuzz -------------------------------------------------------------------------------------

SPEAK_FIELDS = ("text", "voice", "format", "sample_rate", "max_duration_s", "seed", "priority")
FIELD_NAMES = st.sampled_from(
    (*SPEAK_FIELDS, "use_audio_prompt", "api_key", "data", "type", "stream_id")
) | st.text(max_size=10)

scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.sampled_from(["pcm", "opus", "encodec", "realtime", "batch", "", "default"])
    | st.sampled_from([16000, 24000, 48000, 0, -1, 2**63])
    | st.text(max_size=12)
)
values = st.recursive(
    scalars,
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=5), children, max_size=3)
    ),
    max_leaves=12,
)
message_shapes = st.builds(
    lambda kind, fields: {"type": kind, **fields},
    st.sampled_from(CLIENT_TYPES) | values,
    st.dictionaries(FIELD_NAMES, values, max_size=5),
)


def check_parse(text: str) -> None:
    try:
        parsed = parse_client_message(text)
    except ProtocolError as exc:
        assert exc.code in PARSE_CODES
        assert exc.message
        return
    assert parsed.type in CLIENT_TYPES
    if isinstance(parsed, Speak):
        try:
            rate = resolve_sample_rate(parsed, NATIVE_RATE)
        except ProtocolError as exc:
            assert exc.code == "invalid_sample_rate"
        else:
            assert rate in (*PCM_SAMPLE_RATES, NATIVE_RATE)
    if isinstance(parsed, Ping):
        strict_json(server_message("pong", data=parsed.data))  # the echo is writable


@settings(max_examples=300, deadline=None)
@given(message_shapes)
def test_fuzzed_message_shapes_only_ever_raise_protocol_errors(payload: dict[str, Any]) -> None:
    check_parse(json.dumps(payload))


@settings(max_examples=200, deadline=None)
@given(
    st.text(alphabet=st.sampled_from([*'{}[]":,\\ 019eE.-typespakNn', "\ud800"]), max_size=50)
    | st.text(max_size=50)
)
def test_fuzzed_text_only_ever_raises_protocol_errors(text: str) -> None:
    check_parse(text)


@settings(max_examples=100, deadline=None)
@given(st.integers(min_value=1, max_value=3 * MAX_DEPTH), st.sampled_from(CLIENT_TYPES))
def test_nested_fields_of_any_depth_only_ever_raise_protocol_errors(depth: int, kind: str) -> None:
    nested = "[" * depth + "]" * depth
    check_parse(f'{{"type": "{kind}", "data": {nested}}}')


@pytest.mark.parametrize(("header", "spill"), [(None, False), ("0", False), ("1", True)])
def test_the_spill_header_asks_for_a_node_with_room(header: str | None, spill: bool) -> None:
    assert wants_spill(header) is spill


@pytest.mark.parametrize(
    "header", ["", "yes", "true", "2", "1,1", "\x00", "é" * 500, "1" * 10_000, "\r\n1"]
)
def test_any_other_spill_header_is_invalid_header(header: str) -> None:
    """Refused, never guessed at; the message names the header and shows at most 32
    characters of the value, in ASCII."""
    with pytest.raises(ProtocolError, match="X-Cadenza-Spill must be 1 or 0") as refused:
        wants_spill(header)
    assert refused.value.code == "invalid_header"
    assert len(str(refused.value)) < 200 and str(refused.value).isascii()
