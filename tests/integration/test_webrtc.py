"""WebRTC with a real aiortc peer against the real server."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from cadenza.client.webrtc import WebRTCPeer as Peer
from tests.integration.server import RunningServer


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    running = RunningServer(tmp_path_factory.mktemp("rtc") / "server.log")
    try:
        running.wait_ready()
        yield running
    finally:
        running.stop()


def _metric(server, name):
    text = httpx.get(f"{server.url}/metrics").text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name))


def test_speak_over_the_control_channel_plays_audio(server):
    async def main():
        peer = Peer(server.url)
        try:
            await peer.connect()
            peer.send({"type": "speak", "text": "x" * 28, "seed": 1})
            started = await peer.next_event({"started", "error"})
            assert started["type"] == "started" and started["sample_rate"] == 48000
            done = await peer.next_event({"done", "error"})
            await asyncio.sleep(0.3)
            return peer.result, done
        finally:
            await peer.close()

    result, done = asyncio.run(main())
    assert done["type"] == "done" and done["reason"] == "length"
    assert done["stats"]["ttfa_ms"] > 0 and done["stats"]["audio_s"] >= 1.9
    assert result.loud_samples() > 10_000  # non-silent audio arrived over RTP


def test_cancel_stops_audio_at_once_and_frees_the_stream(server):
    async def main():
        peer = Peer(server.url)
        try:
            await peer.connect()
            peer.send({"type": "speak", "text": "x" * 2000, "max_duration_s": 60})
            await peer.next_event({"started"})
            while peer.result.loud_samples() == 0:
                await asyncio.sleep(0.05)
            peer.send({"type": "cancel"})
            done = await peer.next_event({"done"})
            await asyncio.sleep(0.3)  # frames already in flight
            before = peer.result.loud_samples()
            await asyncio.sleep(1.0)
            return done, before, peer.result.loud_samples()
        finally:
            await peer.close()

    done, before, after = asyncio.run(main())
    assert done["reason"] == "cancelled"
    assert after == before  # silence after barge-in: nothing queued kept playing
    deadline = time.monotonic() + 10
    while _metric(server, "cadenza_engine_requests") or _metric(server, "cadenza_streams_active"):
        assert time.monotonic() < deadline, "the cancelled stream was not freed"
        time.sleep(0.3)


def test_several_peers_at_once_and_bad_messages(server):
    async def one(index):
        peer = Peer(server.url)
        try:
            await peer.connect()
            peer.send({"type": "dance"})
            error = await peer.next_event({"error"})
            peer.send({"type": "speak", "text": "x" * 14, "seed": index})
            done = await peer.next_event({"done", "error"})
            return error["code"], done["type"]
        finally:
            await peer.close()

    async def main():
        return await asyncio.gather(*(one(i) for i in range(3)))

    assert asyncio.run(main()) == [("unknown_type", "done")] * 3


@pytest.mark.parametrize(
    ("body", "code"),
    [
        (b"not json", "invalid_offer"),
        (b'{"sdp": "v=0", "type": "answer"}', "invalid_offer"),
        (b'{"type": "offer"}', "invalid_offer"),
        (b'{"sdp": "garbage that is no SDP", "type": "offer"}', "invalid_sdp"),
    ],
)
def test_invalid_offers_are_refused(server, body, code):
    response = httpx.post(f"{server.url}/v1/webrtc/offer", content=body)
    assert response.status_code == 400
    assert response.json()["error"]["code"] == code
