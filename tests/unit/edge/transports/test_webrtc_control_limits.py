"""What keeps one WebRTC client from holding more than its share: pending offers per credential
(:func:`check_pending_offers`), control messages over ``server.ws_max_message_bytes`` refused
unread (:func:`oversized`), and a connected peer idle for ``server.webrtc_idle_timeout_s``
told ``idle_timeout`` and closed, by the idle WebSocket session's rule."""

from __future__ import annotations

import asyncio
import json
import time
from types import SimpleNamespace
from typing import Any

import pytest

from cadenza.config import ServerConfig
from cadenza.edge.streams.errors import EdgeError
from cadenza.edge.streams.speak_session import CloseConnection, Event, Send, SpeakSession
from cadenza.edge.transports import webrtc
from cadenza.edge.transports.webrtc_offer import check_pending_offers

SERVER = ServerConfig(max_pending_webrtc_offers=5, max_pending_webrtc_offers_per_client=2)


def test_a_client_with_its_share_of_pending_offers_is_429_and_others_still_offer() -> None:
    check_pending_offers(["ip:a"], "ip:a", SERVER)
    with pytest.raises(EdgeError) as refused:
        check_pending_offers(["ip:a", "ip:b", "ip:a"], "ip:a", SERVER)
    error = refused.value
    assert (error.status, error.code) == (429, "too_many_offers")
    assert error.retry_after_s == SERVER.webrtc_connect_timeout_s
    check_pending_offers(["ip:a", "ip:b", "ip:a"], "ip:b", SERVER)


def test_a_server_with_every_pending_place_taken_is_503() -> None:
    with pytest.raises(EdgeError) as refused:
        check_pending_offers(["ip:a", "ip:b", "ip:c", "ip:d", "ip:e"], "ip:f", SERVER)
    assert (refused.value.status, refused.value.code) == (503, "too_many_offers")


@pytest.mark.parametrize(
    ("message", "too_large"),
    [
        ("x" * 1024, False),
        ("x" * 1025, True),
        ("é" * 512, False),  # 1,024 bytes of UTF-8
        ("é" * 513, True),  # 513 characters, but 1,026 bytes
        (b"\x00" * 1025, True),
        (b"\x00" * 10, False),
    ],
)
def test_the_size_limit_counts_bytes_as_sent(message: str | bytes, too_large: bool) -> None:
    why = webrtc.oversized(message, 1024)
    assert (why is not None) == too_large
    if why is not None:
        assert "limit is 1024" in why


def _peer(max_message_bytes: int = 1024, idle_timeout_s: float = 0.2) -> Any:
    """The parts of a :class:`WebRTCSession` that its control limits use."""
    server = SimpleNamespace(
        ws_max_message_bytes=max_message_bytes, webrtc_idle_timeout_s=idle_timeout_s
    )
    peer = SimpleNamespace(
        state=SimpleNamespace(config=SimpleNamespace(server=server)),
        session=SpeakSession(
            check_speak=lambda speak: 48000,
            codec_rate=lambda speak: 24000,
            max_prompt_audio_s=20.0,
            binary_audio=False,
            idle_timeout_s=idle_timeout_s,
        ),
        sent=[],
        executed=[],
        _inbox=asyncio.Queue(maxsize=4),
        _active_at=time.monotonic(),
    )
    peer._send = peer.sent.append

    async def execute(events: list[Event]) -> None:
        peer.executed.extend(events)

    peer._execute = execute
    return peer


def test_an_oversized_control_message_is_refused_unread() -> None:
    async def scenario() -> Any:
        peer = _peer()
        webrtc.WebRTCSession._enqueue(peer, json.dumps({"type": "ping", "data": "x" * 2000}))
        webrtc.WebRTCSession._enqueue(peer, '{"type": "ping"}')
        return peer

    peer = asyncio.run(scenario())
    assert [json.loads(text)["code"] for text in peer.sent] == ["message_too_large"]
    assert peer._inbox.qsize() == 1  # only the ping goes on to be read


def test_a_peer_that_sends_nothing_while_nothing_plays_is_closed() -> None:
    async def scenario() -> tuple[Any, float]:
        peer = _peer(idle_timeout_s=0.2)
        started = time.monotonic()
        await asyncio.wait_for(webrtc.WebRTCSession._close_when_idle(peer), 5)
        return peer, time.monotonic() - started

    peer, waited_s = asyncio.run(scenario())
    send, close = peer.executed
    assert isinstance(send, Send) and json.loads(send.text)["code"] == "idle_timeout"
    assert isinstance(close, CloseConnection) and close.code == 4000
    assert 0.15 <= waited_s < 2.0


def test_playing_and_messages_keep_a_peer_open() -> None:
    async def scenario() -> tuple[Any, float]:
        peer = _peer(idle_timeout_s=0.3)
        peer.session.active_stream_id = 1  # an utterance plays
        watch = asyncio.ensure_future(webrtc.WebRTCSession._close_when_idle(peer))
        await asyncio.sleep(0.5)
        assert not peer.executed
        peer.session.active_stream_id = None  # it ended: the idle clock starts now
        peer._active_at = time.monotonic()
        await asyncio.sleep(0.2)
        webrtc.WebRTCSession._enqueue(peer, '{"type": "ping"}')  # activity
        ended = time.monotonic()
        await asyncio.wait_for(watch, 5)
        return peer, time.monotonic() - ended

    peer, waited_s = asyncio.run(scenario())
    assert json.loads(peer.executed[0].text)["code"] == "idle_timeout"
    assert 0.25 <= waited_s < 2.0
