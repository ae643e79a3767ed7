"""WebRTC with a real aiortc peer against the real server."""

from __future__ import annotations

import asyncio
import fractions
import time

import av
import httpx
import numpy as np
import pytest
from aiortc.mediastreams import MediaStreamTrack

from cadenza.client.webrtc import WebRTCPeer as Peer
from tests.integration.server import serving


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with serving(tmp_path_factory.mktemp("rtc") / "server.log") as running:
        yield running


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
    while server.metric("cadenza_engine_requests") or server.metric("cadenza_streams_active"):
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


class SineMicrophone(MediaStreamTrack):
    """A fake microphone: a 200 Hz tone in 20 ms frames at 48 kHz, paced like a real one."""

    kind = "audio"

    def __init__(self) -> None:
        super().__init__()
        self._sent = 0
        self._start = time.monotonic()

    async def recv(self) -> av.AudioFrame:
        due = self._start + self._sent * 0.02
        await asyncio.sleep(max(0.0, due - time.monotonic()))
        t = (np.arange(960) + self._sent * 960) / 48000
        pcm = (0.3 * np.sin(2 * np.pi * 200 * t) * 32767).astype("<i2")
        frame = av.AudioFrame.from_ndarray(pcm[None], format="s16", layout="mono")
        frame.sample_rate, frame.pts = 48000, self._sent * 960
        frame.time_base = fractions.Fraction(1, 48000)
        self._sent += 1
        return frame


def test_microphone_track_becomes_the_speech_prompt(server):
    async def main():
        without = Peer(server.url)
        with_mic = Peer(server.url, microphone=SineMicrophone())
        try:
            await without.connect()
            without.send({"type": "speak", "text": "hi", "use_audio_prompt": True})
            refused = await without.next_event({"error", "started"})
            await with_mic.connect()
            await asyncio.sleep(1.0)  # a second of microphone audio reaches the server
            with_mic.send({"type": "speak", "text": "x" * 14, "use_audio_prompt": True})
            done = await with_mic.next_event({"done", "error"})
            return refused, done
        finally:
            await without.close()
            await with_mic.close()

    refused, done = asyncio.run(main())
    assert refused["type"] == "error" and refused["code"] == "no_prompt_audio"
    assert done["type"] == "done" and done["reason"] == "length"


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


def test_the_pacing_benchmark_reports_every_peer(server):
    from cadenza.bench import pacing

    result = pacing.run(server.url, peers=2, seconds=1.0)
    assert [peer["outcome"] for peer in result["peers_detail"]] == ["done", "done"]
    assert result["send_jitter_p99_ms"] is not None and result["ttfa_ms_median"] > 0
