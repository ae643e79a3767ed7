"""The rules of a speak session, driven the way the websockets library tests its sans-I/O
protocol: feed client text and bytes, check the events that come out (the table in
:mod:`cadenza.edge.streams.speak_session`'s docstring, row by row), then fuzz it."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cadenza.contract.request import SynthesisRequest
from cadenza.contract.sampling import SamplingParams
from cadenza.edge.streams import protocol
from cadenza.edge.streams.protocol import ProtocolError, Speak
from cadenza.edge.streams.speak_session import (
    CLOSE_IDLE,
    CLOSE_NORMAL,
    CloseConnection,
    FeedText,
    Renew,
    ResumeUtterance,
    Send,
    SpeakSession,
    StartUtterance,
    StopUtterance,
)
from cadenza.edge.streams.untrusted_json import MAX_DEPTH

CODEC_RATE = 24000
IDLE_S = 60.0
EVENT_TYPES = (
    Send,
    StartUtterance,
    ResumeUtterance,
    FeedText,
    StopUtterance,
    CloseConnection,
    Renew,
)


def resolve(speak: Speak) -> int:
    return protocol.resolve_sample_rate(speak, CODEC_RATE)


def resolve_codec(speak: Speak) -> int:
    """The codec rate of the model a speak names: 44.1 kHz for "dia", else CODEC_RATE."""
    return 44100 if speak.model == "dia" else CODEC_RATE


def new_session(binary_audio: bool = True, idle_timeout_s: float | None = IDLE_S) -> SpeakSession:
    return SpeakSession(
        check_speak=resolve,
        codec_rate=resolve_codec,
        max_prompt_audio_s=5.0,
        binary_audio=binary_audio,
        idle_timeout_s=idle_timeout_s,
    )


def text(**fields: Any) -> str:
    return json.dumps(fields)


def speak(words: str = "Hello.", **fields: Any) -> str:
    return text(type="speak", text=words, **fields)


def sent(event: Any) -> dict[str, Any]:
    assert isinstance(event, Send)
    return json.loads(event.text)


def single_error(events: list[Any]) -> dict[str, Any]:
    assert len(events) == 1
    message = sent(events[0])
    assert message["type"] == "error"
    return message


def pcm(seconds: float, rate: int) -> bytes:
    t = np.arange(int(seconds * rate)) / rate
    return (0.3 * np.sin(2 * np.pi * 220 * t) * 32767).astype("<i2").tobytes()


def start(session: SpeakSession, message: str | None = None) -> StartUtterance:
    events = session.receive_text(message or speak())
    assert len(events) == 1 and isinstance(events[0], StartUtterance), events
    return events[0]


# -- speak ------------------------------------------------------------------------------------


def test_speak_starts_utterances_numbered_from_one() -> None:
    session = new_session()
    first = start(session, speak("One.", format="pcm", sample_rate=48000))
    assert (first.stream_id, first.sample_rate, first.speak.text) == (1, 48000, "One.")
    assert first.prompt_audio is None and first.prompt_sample_rate == CODEC_RATE
    assert session.active_stream_id == 1
    session.utterance_ended(1)
    second = start(session, speak("Two."))
    assert (second.stream_id, second.sample_rate) == (2, CODEC_RATE)


def test_resume_goes_on_with_a_lost_stream_as_the_next_utterance() -> None:
    session = new_session()
    start(session)
    session.utterance_ended(1)
    [resume] = session.receive_text(text(type="resume", token="t" * 32, samples_heard=4800))
    assert isinstance(resume, ResumeUtterance) and resume.stream_id == 2
    assert resume.resume.token == "t" * 32 and resume.resume.samples_heard == 4800
    assert session.active_stream_id == 2
    busy = single_error(session.receive_text(text(type="resume", token="u" * 32, frames_heard=1)))
    assert busy["code"] == "busy"


@pytest.mark.parametrize("heard", [{}, {"samples_heard": 1, "frames_heard": 1}])
def test_resume_counts_samples_or_frames_not_both_nor_neither(heard: dict[str, int]) -> None:
    session = new_session()
    error = single_error(session.receive_text(text(type="resume", token="t" * 32, **heard)))
    assert error["code"] == "invalid_message" and "samples_heard" in error["message"]
    assert session.active_stream_id is None


def test_speak_while_an_utterance_plays_is_busy_and_starts_nothing() -> None:
    session = new_session()
    start(session)
    error = single_error(session.receive_text(speak("Again.")))
    assert error["code"] == "busy" and error["stream_id"] is None
    assert session.active_stream_id == 1


def test_cancel_stops_the_utterance_says_done_and_a_new_speak_is_accepted() -> None:
    session = new_session()
    start(session)
    events = session.receive_text(text(type="cancel"))
    assert events[0] == StopUtterance(1)
    assert sent(events[1]) == {"type": "done", "stream_id": 1, "reason": "cancelled"}
    assert len(events) == 2 and session.active_stream_id is None
    assert start(session).stream_id == 2


def test_cancel_when_idle_does_nothing() -> None:
    session = new_session()
    assert session.receive_text(text(type="cancel")) == []
    start(session)
    session.utterance_ended(1)
    assert session.receive_text(text(type="cancel")) == []


def test_close_when_idle_closes_normally() -> None:
    assert new_session().receive_text(text(type="close")) == [CloseConnection(CLOSE_NORMAL)]
    assert CLOSE_NORMAL == 1000


def test_close_while_playing_stops_says_done_then_closes() -> None:
    session = new_session()
    start(session)
    events = session.receive_text(text(type="close"))
    assert len(events) == 3
    assert events[0] == StopUtterance(1)
    assert sent(events[1]) == {"type": "done", "stream_id": 1, "reason": "cancelled"}
    assert events[2] == CloseConnection(1000)


@pytest.mark.parametrize("data", [None, 0, "t=1", [1, {"a": None}], {"nested": {"x": [1.5]}}])
def test_ping_echoes_its_data(data: Any) -> None:
    events = new_session().receive_text(text(type="ping", data=data))
    assert len(events) == 1 and sent(events[0]) == {"type": "pong", "data": data}


def test_ping_without_data_gets_null_data() -> None:
    [pong] = new_session().receive_text(text(type="ping"))
    assert sent(pong) == {"type": "pong", "data": None}


def test_hello_after_the_session_opened_renews_its_credential() -> None:
    session = new_session()
    assert session.receive_text(text(type="hello", api_key="k")) == [Renew("k")]
    assert session.active_stream_id is None


# -- garbage ----------------------------------------------------------------------------------

GARBAGE = [
    ("not json at all", "invalid_json"),
    ("", "invalid_json"),
    ("[1, 2]", "invalid_json"),
    (
        '{"type": "ping", "data": ' + "[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1) + "}",
        "invalid_json",
    ),
    ("[" * 50_000, "invalid_json"),
    ('{"type": "speak", "text": "\\ud800"}', "invalid_json"),
    ('{"type": "speak", "text": "\udc00"}', "invalid_json"),
    ('{"type": "speak", "text": "x", "seed": ' + "9" * 50 + "}", "invalid_json"),
    ('{"type": "ping", "data": NaN}', "invalid_json"),
    ('{"type": "ping", "data": -Infinity}', "invalid_json"),
    ('{"type": "ping", "data": 1e999}', "invalid_json"),
    ('{"type": "shout"}', "unknown_type"),
    ('{"text": "no type"}', "unknown_type"),
    ('{"type": "speak", "text": "x", "volume": 11}', "invalid_message"),
    ('{"type": "speak", "text": "x", "seed": -5}', "invalid_message"),
    ('{"type": "speak"}', "invalid_message"),
]


@pytest.mark.parametrize(("garbage", "code"), GARBAGE)
def test_garbage_gets_one_error_and_the_session_goes_on(garbage: str, code: str) -> None:
    session = new_session()
    error = single_error(session.receive_text(garbage))
    assert error["code"] == code and error["message"] and error["stream_id"] is None
    assert start(session).stream_id == 1


def test_garbage_while_playing_leaves_the_utterance_playing() -> None:
    session = new_session()
    start(session)
    single_error(session.receive_text("{"))
    assert session.active_stream_id == 1
    assert session.receive_text(text(type="cancel"))[0] == StopUtterance(1)


@pytest.mark.parametrize(
    ("message", "code"),
    [
        (speak(format="opus", sample_rate=24000), "invalid_sample_rate"),
        (speak(sample_rate=0), "invalid_sample_rate"),
        (speak(sample_rate=-48000), "invalid_sample_rate"),
        (speak(format="encodec", sample_rate=16000), "invalid_sample_rate"),
    ],
)
def test_a_speak_the_transport_refuses_is_an_error_with_its_stream_id(
    message: str, code: str
) -> None:
    session = new_session()
    error = single_error(session.receive_text(message))
    assert error["code"] == code and error["stream_id"] == 1
    assert session.active_stream_id is None
    # The refused speak used up stream id 1.
    assert start(session).stream_id == 2


def test_a_check_speak_protocol_error_is_reported_with_the_stream_id() -> None:
    def refuse(speak: Speak) -> int:
        raise ProtocolError("invalid_message", f"no {speak.format} here")

    session = SpeakSession(
        check_speak=refuse, codec_rate=resolve_codec, max_prompt_audio_s=5, binary_audio=True
    )
    error = single_error(session.receive_text(speak()))
    assert error == {
        "type": "error",
        "code": "invalid_message",
        "message": "no pcm here",
        "stream_id": 1,
    }
    assert session.active_stream_id is None


# -- microphone audio -------------------------------------------------------------------------


def test_binary_before_audio_in_is_unexpected() -> None:
    session = new_session()
    error = single_error(session.receive_bytes(pcm(0.1, 16000)))
    assert error["code"] == "unexpected_binary" and "audio_in" in error["message"]
    assert session.microphone is None


def test_audio_in_then_pcm_bytes_collect_microphone_audio() -> None:
    session = new_session()
    assert session.receive_text(text(type="audio_in", sample_rate=24000)) == []
    for _ in range(3):
        assert session.receive_bytes(pcm(0.25, 24000)) == []
    assert session.microphone is not None
    assert session.microphone.sample_rate == 24000
    assert session.microphone.seconds == pytest.approx(0.75)


def test_a_new_audio_in_starts_a_new_recording() -> None:
    session = new_session()
    session.receive_text(text(type="audio_in"))
    session.receive_bytes(pcm(0.5, 16000))
    session.receive_text(text(type="audio_in", sample_rate=48000))
    assert session.microphone is not None and session.microphone.seconds == 0


def test_torn_pcm_is_invalid_audio_and_keeps_what_came_before() -> None:
    session = new_session()
    session.receive_text(text(type="audio_in"))
    session.receive_bytes(pcm(0.5, 16000))
    error = single_error(session.receive_bytes(b"\x01\x02\x03"))
    assert error["code"] == "invalid_audio" and error["stream_id"] is None
    assert session.microphone is not None
    assert session.microphone.seconds == pytest.approx(0.5)


def test_corrupt_opus_is_invalid_audio() -> None:
    session = new_session()
    session.receive_text(text(type="audio_in", format="opus"))
    for packet in (b"", b"\xff\xfe\x00garbage"):
        assert single_error(session.receive_bytes(packet))["code"] == "invalid_audio"


def test_use_audio_prompt_without_microphone_audio_is_no_prompt_audio() -> None:
    session = new_session()
    error = single_error(session.receive_text(speak(use_audio_prompt=True)))
    assert error["code"] == "no_prompt_audio" and error["stream_id"] == 1
    assert session.active_stream_id is None
    session.receive_text(text(type="audio_in"))  # announced, but nothing sent yet
    error = single_error(session.receive_text(speak(use_audio_prompt=True)))
    assert error["code"] == "no_prompt_audio" and error["stream_id"] == 2


def test_the_prompt_is_resampled_to_the_codec_rate_and_consumed() -> None:
    session = new_session()
    session.receive_text(text(type="audio_in", sample_rate=16000))
    session.receive_bytes(pcm(1.0, 16000))
    utterance = start(session, speak(use_audio_prompt=True))
    assert utterance.prompt_sample_rate == CODEC_RATE
    assert utterance.prompt_audio is not None
    prompt = np.frombuffer(utterance.prompt_audio, "<f4")
    assert abs(prompt.size - CODEC_RATE) <= 32  # one second at 24 kHz
    assert 0.2 < np.abs(prompt).max() <= 1.0
    session.utterance_ended(utterance.stream_id)
    error = single_error(session.receive_text(speak(use_audio_prompt=True)))
    assert error["code"] == "no_prompt_audio"


def test_the_microphone_audio_goes_at_the_codec_rate_of_the_model_the_speak_names() -> None:
    session = new_session()
    session.receive_text(text(type="audio_in", sample_rate=16000))
    session.receive_bytes(pcm(1.0, 16000))
    utterance = start(session, speak(use_audio_prompt=True, model="dia"))
    assert utterance.prompt_sample_rate == 44100 and utterance.prompt_audio is not None
    assert abs(len(utterance.prompt_audio) // 4 - 44100) <= 64
    session.utterance_ended(utterance.stream_id)
    session.receive_bytes(pcm(0.5, 16000))
    fields = {"conversation": True, "use_audio_prompt": True, "user_voice": "default"}
    answer = start(session, speak(model="dia", user_text="[S1] Hi.", **fields))
    assert answer.prompt_sample_rate == 44100
    [turn] = answer.context
    assert turn.text == "[S1] Hi." and turn.audio is not None
    assert abs(len(turn.audio) // 4 - 22050) <= 64


def test_a_speak_without_use_audio_prompt_leaves_the_microphone_audio() -> None:
    session = new_session()
    session.receive_text(text(type="audio_in"))
    session.receive_bytes(pcm(0.5, 16000))
    assert start(session).prompt_audio is None
    assert session.microphone is not None and session.microphone.seconds == pytest.approx(0.5)


def test_a_refused_or_busy_speak_does_not_consume_the_microphone_audio() -> None:
    session = new_session()
    session.receive_text(text(type="audio_in"))
    session.receive_bytes(pcm(0.5, 16000))
    refused = session.receive_text(speak(use_audio_prompt=True, format="opus", sample_rate=1))
    assert single_error(refused)["code"] == "invalid_sample_rate"
    start(session)
    busy = session.receive_text(speak(use_audio_prompt=True))
    assert single_error(busy)["code"] == "busy"
    session.utterance_ended(2)
    assert start(session, speak(use_audio_prompt=True)).prompt_audio is not None


# -- time -------------------------------------------------------------------------------------


def test_the_idle_limit_applies_only_while_nothing_plays() -> None:
    session = new_session(idle_timeout_s=12.5)
    assert session.idle_timeout_s() == 12.5
    start(session)
    assert session.idle_timeout_s() is None
    session.utterance_ended(1)
    assert session.idle_timeout_s() == 12.5


def test_without_an_idle_limit_there_is_never_a_timeout() -> None:
    session = new_session(idle_timeout_s=None)
    assert session.idle_timeout_s() is None
    start(session)
    assert session.idle_timeout_s() is None


def test_timing_out_says_idle_timeout_and_closes_with_4000() -> None:
    events = new_session().timed_out()
    assert len(events) == 2
    assert sent(events[0])["code"] == "idle_timeout"
    assert events[1] == CloseConnection(CLOSE_IDLE) and CLOSE_IDLE == 4000


def test_utterance_ended_clears_only_its_own_stream() -> None:
    session = new_session()
    start(session)
    session.utterance_ended(7)
    assert session.active_stream_id == 1
    session.utterance_ended(1)
    assert session.active_stream_id is None
    session.utterance_ended(1)  # twice is harmless
    assert session.active_stream_id is None


def test_a_late_end_of_a_cancelled_utterance_leaves_the_next_one_playing() -> None:
    session = new_session()
    start(session)
    session.receive_text(text(type="cancel"))
    start(session)
    session.utterance_ended(1)  # the transport reports the cancelled one after the new speak
    assert session.active_stream_id == 2


# -- WebRTC mode ------------------------------------------------------------------------------


def test_webrtc_mode_refuses_binary_messages() -> None:
    session = new_session(binary_audio=False)
    error = single_error(session.receive_bytes(pcm(0.1, 16000)))
    assert error["code"] == "unexpected_binary" and "JSON text" in error["message"]
    assert session.receive_text(text(type="audio_in")) == []
    error = single_error(session.receive_bytes(pcm(0.1, 16000)))
    assert error["code"] == "unexpected_binary"
    assert session.microphone is None


def test_webrtc_mode_hears_the_microphone_track() -> None:
    session = new_session(binary_audio=False)
    tone = np.frombuffer(pcm(0.5, 48000), "<i2").astype(np.float32) / 32768
    session.hear(tone, 48000)
    session.hear(tone, 48000)
    assert session.microphone is not None and session.microphone.seconds == pytest.approx(1.0)
    session.hear(tone[:4800], 16000)  # another rate: a new recording
    assert session.microphone.sample_rate == 16000
    assert session.microphone.seconds == pytest.approx(0.3)
    utterance = start(session, speak(use_audio_prompt=True))
    assert utterance.prompt_audio is not None
    assert abs(len(utterance.prompt_audio) // 4 - int(0.3 * CODEC_RATE)) <= 32


# -- the synthesis request --------------------------------------------------------------------


def test_start_utterance_builds_a_synthesis_request_with_a_fresh_id() -> None:
    session = new_session()
    session.receive_text(text(type="audio_in"))
    session.receive_bytes(pcm(0.2, 16000))
    message = speak(
        "Say this.",
        voice="alto",
        max_duration_s=3.5,
        seed=42,
        top_p=0.9,
        use_audio_prompt=True,
    )
    utterance = start(session, message)
    model_defaults = SamplingParams(temperature=0.6, top_p=0.8, repetition_penalty=1.3)
    request = utterance.synthesis_request(model_defaults)
    assert isinstance(request, SynthesisRequest)
    assert (request.text, request.voice, request.max_duration_s) == ("Say this.", "alto", 3.5)
    assert request.sampling == SamplingParams(  # the client's choices over the model's
        temperature=0.6, top_p=0.9, repetition_penalty=1.3, seed=42
    )
    assert request.prompt_audio == utterance.prompt_audio
    assert request.prompt_sample_rate == CODEC_RATE
    assert request.prompt_audio_samples == len(utterance.prompt_audio or b"") // 4
    again = utterance.synthesis_request(model_defaults)
    assert again.request_id != request.request_id
    assert len(request.request_id) == 32 and int(request.request_id, 16) >= 0


def test_a_plain_speak_builds_a_request_without_prompt_or_seed() -> None:
    request = start(new_session()).synthesis_request(SamplingParams())
    assert request.prompt_audio is None and request.prompt_audio_samples == 0
    assert request.sampling.seed is None and request.max_duration_s is None


# -- fuzz -------------------------------------------------------------------------------------

json_leaves = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8)
)
client_texts = st.one_of(
    st.sampled_from(
        [
            speak(),
            speak(use_audio_prompt=True),
            speak(conversation=True),
            speak(conversation=True, use_audio_prompt=True, user_voice="1"),
            speak(conversation=True, use_audio_prompt=True),
            text(type="reset_conversation"),
            speak(format="opus"),
            speak(format="encodec", sample_rate=8000),
            speak(sample_rate=0),
            text(type="cancel"),
            text(type="close"),
            text(type="ping", data=[1, "x"]),
            text(type="hello", api_key="k"),
            text(type="audio_in"),
            text(type="audio_in", format="opus"),
            text(type="audio_in", sample_rate=48000),
            '{"type": "ping", "data": NaN}',
            '{"type": "speak", "text": "\\udfff"}',
            "[" * (MAX_DEPTH + 2),
            "",
        ]
    ),
    st.builds(
        lambda kind, fields: json.dumps({"type": kind, **fields}),
        st.sampled_from(protocol.CLIENT_TYPES),
        st.dictionaries(
            st.sampled_from(["text", "format", "sample_rate", "seed", "data", "use_audio_prompt"]),
            json_leaves,
            max_size=3,
        ),
    ),
    st.text(max_size=30),
)
client_bytes = st.one_of(
    st.binary(max_size=64),
    st.sampled_from([pcm(0.05, 16000), pcm(0.02, 48000), b"\x00", b""]),
)
actions = st.lists(
    st.one_of(
        st.tuples(st.just("text"), client_texts),
        st.tuples(st.just("bytes"), client_bytes),
        st.tuples(st.just("ended"), st.integers(min_value=0, max_value=6)),
        st.tuples(st.just("ended_active"), st.none()),
    ),
    max_size=25,
)


@settings(max_examples=120, deadline=None)
@given(actions, st.booleans())
def test_any_sequence_of_client_messages_plays_at_most_one_utterance(
    steps: list[tuple[str, Any]], binary_audio: bool
) -> None:
    session = new_session(binary_audio=binary_audio)
    playing: int | None = None
    last_id = 0
    for kind, value in steps:
        if kind == "ended":
            session.utterance_ended(value)
            playing = None if playing == value else playing
            continue
        if kind == "ended_active":
            if playing is not None:
                session.utterance_ended(playing)
                playing = None
            continue
        events = session.receive_text(value) if kind == "text" else session.receive_bytes(value)
        assert isinstance(events, list)
        for event in events:
            assert isinstance(event, EVENT_TYPES)
            if isinstance(event, StartUtterance):
                assert playing is None, "a second utterance started while one plays"
                assert event.stream_id > last_id
                playing = last_id = event.stream_id
            elif isinstance(event, StopUtterance):
                assert event.stream_id == playing
                playing = None
            elif isinstance(event, Send):
                assert sent(event)["type"] in {"error", "pong", "done", "conversation"}
        assert session.active_stream_id == playing
        assert sum(isinstance(e, StartUtterance) for e in events) <= 1


# -- text streams ---------------------------------------------------------------------------


def text_stream(session: SpeakSession, first: str = "") -> int:
    started = start(session, text(type="speak", text_stream=True, text=first))
    assert started.speak.text_stream and started.speak.first_text == first
    return started.stream_id


def test_text_flush_and_text_end_feed_the_playing_text_stream() -> None:
    session = new_session()
    stream_id = text_stream(session, "Hi")
    assert session.receive_text(text(type="text", stream_id=stream_id, text=" there")) == [
        FeedText(stream_id, text=" there")
    ]
    assert session.receive_text(text(type="flush", stream_id=stream_id)) == [
        FeedText(stream_id, flush=True)
    ]
    assert session.receive_text(text(type="text_end", stream_id=stream_id)) == [
        FeedText(stream_id, end=True)
    ]
    after = single_error(session.receive_text(text(type="text", stream_id=stream_id, text="x")))
    assert after["code"] == "text_ended" and after["stream_id"] == stream_id
    again = single_error(session.receive_text(text(type="text_end", stream_id=stream_id)))
    assert again["code"] == "text_ended"


@pytest.mark.parametrize(
    "message",
    [
        {"type": "text", "stream_id": 2, "text": "x"},
        {"type": "flush", "stream_id": 2},
        {"type": "text_end", "stream_id": 0},
    ],
)
def test_text_for_a_stream_that_is_not_the_playing_text_stream_is_unknown(message) -> None:
    session = new_session()
    assert single_error(session.receive_text(text(**message)))["code"] == "unknown_stream"
    start(session)  # a stream that is not a text stream
    assert single_error(session.receive_text(text(**message)))["code"] == "unknown_stream"


@pytest.mark.parametrize(
    "fields",
    [
        {"text": 5},
        {"text": None},
        {"text": ["a"]},
        {},
        {"text": "a", "extra": 1},
        {"text": "a", "stream_id": "1"},
        {"text": "a", "stream_id": -1},
        {"text": "a", "stream_id": 2**40},
    ],
)
def test_malformed_text_messages_are_invalid_and_the_stream_goes_on(fields) -> None:
    session = new_session()
    stream_id = text_stream(session)
    message = {"type": "text", "stream_id": stream_id, **fields}
    assert single_error(session.receive_text(text(**message)))["code"] == "invalid_message"
    assert session.active_stream_id == stream_id
    assert session.receive_text(text(type="text", stream_id=stream_id, text="ok")) == [
        FeedText(stream_id, text="ok")
    ]


def test_too_much_text_in_a_message_or_in_all_is_text_too_long() -> None:
    session = SpeakSession(
        check_speak=resolve,
        codec_rate=resolve_codec,
        max_prompt_audio_s=5.0,
        binary_audio=True,
        max_message_chars=10,
        max_text_stream_chars=25,
    )
    stream_id = text_stream(session, "x" * 10)
    message = text(type="text", stream_id=stream_id, text="y" * 11)
    assert single_error(session.receive_text(message))["code"] == "text_too_long"
    ten = text(type="text", stream_id=stream_id, text="z" * 10)
    assert session.receive_text(ten) == [FeedText(stream_id, text="z" * 10)]
    overflow = single_error(session.receive_text(ten))
    assert overflow["code"] == "text_too_long" and "25" in overflow["message"]


def test_a_speak_without_text_is_refused_unless_it_streams_text() -> None:
    session = new_session()
    error = single_error(session.receive_text(text(type="speak")))
    assert error["code"] == "invalid_message" and "text" in error["message"]
    text_stream(session)


def test_a_text_stream_ends_with_its_utterance_or_its_cancel() -> None:
    session = new_session()
    stream_id = text_stream(session)
    session.utterance_ended(stream_id)
    late = text(type="text", stream_id=stream_id, text="late")
    assert single_error(session.receive_text(late))["code"] == "unknown_stream"
    stream_id = text_stream(session)
    session.receive_text(text(type="cancel"))
    late = text(type="text", stream_id=stream_id, text="late")
    assert single_error(session.receive_text(late))["code"] == "unknown_stream"
