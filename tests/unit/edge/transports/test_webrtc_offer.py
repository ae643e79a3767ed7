"""The WebRTC offer body and the one ``speak`` WebRTC can play: :func:`parse_offer` refuses
anything but ``{"sdp": <non-empty string>, "type": "offer"}`` with a 400 ``invalid_offer``, and
:func:`check_webrtc_speak` accepts only PCM at the track's 48 kHz."""

from __future__ import annotations

import json
from typing import Any

import pytest
from aiortc import RTCSessionDescription
from hypothesis import given, settings
from hypothesis import strategies as st

from cadenza.edge.streams.errors import EdgeError
from cadenza.edge.streams.protocol import ProtocolError, Speak
from cadenza.edge.streams.untrusted_json import MAX_DEPTH
from cadenza.edge.transports.paced_track import RTC_RATE
from cadenza.edge.transports.webrtc import check_webrtc_speak
from cadenza.edge.transports.webrtc_offer import parse_offer

SDP = "v=0\r\no=- 0 0 IN IP4 127.0.0.1\r\ns=-\r\nt=0 0\r\n"


def refusal(raw: bytes) -> EdgeError:
    with pytest.raises(EdgeError) as caught:
        parse_offer(raw)
    error = caught.value
    assert (error.status, error.code) == (400, "invalid_offer")
    assert error.message.startswith("invalid offer: ")
    return error


def test_a_well_formed_offer_becomes_a_session_description() -> None:
    offer = parse_offer(json.dumps({"sdp": SDP, "type": "offer"}).encode())
    assert isinstance(offer, RTCSessionDescription)
    assert (offer.sdp, offer.type) == (SDP, "offer")


def test_the_sdp_is_not_parsed_here() -> None:
    assert parse_offer(b'{"type": "offer", "sdp": "anything"}').sdp == "anything"


@pytest.mark.parametrize(
    "raw",
    [
        b"",
        b"sdp=v0",
        b'{"sdp": "v=0", "type": "offer"',
        b"\xff\xfe",
        b'{"sdp": "v=0\xc3", "type": "offer"}',
        b'{"sdp": "\\ud800", "type": "offer"}',
        b'{"sdp": "v=0", "type": "offer", "n": ' + b"9" * 40 + b"}",
        b'{"sdp": "v=0", "type": "offer", "n": NaN}',
    ],
)
def test_a_body_that_is_not_acceptable_json_is_invalid_offer(raw: bytes) -> None:
    refusal(raw)


@pytest.mark.parametrize("depth", [MAX_DEPTH + 1, 50_000])
def test_deep_nesting_is_invalid_offer(depth: int) -> None:
    raw = b'{"type": "offer", "sdp": "v=0", "x": ' + b"[" * depth + b"]" * depth + b"}"
    assert "nested" in refusal(raw).message


@pytest.mark.parametrize(
    "payload",
    [
        [],
        "offer",
        None,
        {"sdp": SDP},
        {"sdp": SDP, "type": "answer"},
        {"sdp": SDP, "type": "OFFER"},
        {"sdp": SDP, "type": None},
        {"sdp": SDP, "type": ["offer"]},
        [{"sdp": SDP, "type": "offer"}],
    ],
)
def test_anything_but_an_offer_object_is_invalid_offer(payload: Any) -> None:
    refusal(json.dumps(payload).encode())


@pytest.mark.parametrize("sdp", [None, "", 0, 1.5, True, ["v=0"], {"v": 0}])
def test_a_missing_empty_or_non_string_sdp_is_invalid_offer(sdp: Any) -> None:
    assert (
        "sdp must be a non-empty string"
        in refusal(json.dumps({"sdp": sdp, "type": "offer"}).encode()).message
    )


def test_an_offer_without_sdp_is_invalid_offer() -> None:
    assert "sdp must be a non-empty string" in refusal(b'{"type": "offer"}').message


@settings(max_examples=150, deadline=None)
@given(
    st.binary(max_size=60)
    | st.dictionaries(
        st.sampled_from(["sdp", "type", "x"]),
        st.none() | st.text(max_size=8) | st.integers() | st.just("offer"),
        max_size=3,
    ).map(lambda d: json.dumps(d).encode())
)
def test_fuzzed_offers_are_parsed_or_refused_with_400(raw: bytes) -> None:
    try:
        offer = parse_offer(raw)
    except EdgeError as exc:
        assert (exc.status, exc.code) == (400, "invalid_offer")
    else:
        assert offer.type == "offer" and isinstance(offer.sdp, str) and offer.sdp


# -- check_webrtc_speak -----------------------------------------------------------------------


def speak(**fields: Any) -> Speak:
    return Speak(type="speak", text="Hi", **fields)


@pytest.mark.parametrize("sample_rate", [None, 48000])
def test_webrtc_plays_pcm_at_48_khz(sample_rate: int | None) -> None:
    assert check_webrtc_speak(speak(format="pcm", sample_rate=sample_rate)) == RTC_RATE == 48000


@pytest.mark.parametrize(
    "fields",
    [
        {"format": "pcm", "sample_rate": 16000},
        {"format": "pcm", "sample_rate": 24000},
        {"format": "pcm", "sample_rate": 0},
        {"format": "pcm", "sample_rate": -48000},
        {"format": "opus"},
        {"format": "opus", "sample_rate": 48000},
        {"format": "encodec"},
        {"format": "encodec", "sample_rate": 24000},
    ],
)
def test_webrtc_refuses_every_other_format_and_rate(fields: dict[str, Any]) -> None:
    with pytest.raises(ProtocolError) as caught:
        check_webrtc_speak(speak(**fields))
    assert caught.value.code == "invalid_message"
    assert "48000" in caught.value.message
