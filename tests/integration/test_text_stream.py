"""Text streamed in (``speak`` with ``text_stream``) over WebSocket (the SDK and raw
``websockets``) and WebRTC (aiortc), against the real server."""

from __future__ import annotations

import asyncio
import json
import time

import pytest
import websockets

from cadenza.client import StreamError, connect
from cadenza.client.webrtc import WebRTCPeer
from cadenza.loadtest.playout import Chunk, simulate_playout
from tests.integration.server import serving, wait_until_idle

IDLE_TIMEOUT_S = 3.5
CLIENT_BUFFER_S = 0.2  # the listener's jitter buffer
TEXT = (
    "The quick brown fox jumps over the lazy dog. It was a sunny day, and the birds were "
    "singing in the trees. Nobody expected what would happen next! Would the fox get away?"
)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    env = {"CADENZA_TEXT_STREAM__IDLE_TIMEOUT_S": str(IDLE_TIMEOUT_S)}
    with serving(tmp_path_factory.mktemp("text") / "server.log", env) as running:
        yield running


@pytest.fixture
def ws_url(server):
    return server.url.replace("http", "ws") + "/v1/stream"


async def _words(text, per_s):
    for word in text.split():
        yield word + " "
        await asyncio.sleep(1 / per_s)


def test_words_at_20_per_s_play_as_one_stream_equal_to_its_segments_said_in_turn(ws_url, server):
    async def main():
        async with connect(ws_url) as session:
            assert "text_stream" in session.ready["features"]
            began = time.monotonic()
            streamed, arrivals = [], []
            async for chunk in session.speak_stream(_words(TEXT, 20), temperature=0):
                streamed.append(chunk)
                arrivals.append(Chunk(time.monotonic(), len(chunk.data) / 2 / chunk.sample_rate))
            stats, segments = session.last_stats, list(session.segments)
            heard = simulate_playout(arrivals, CLIENT_BUFFER_S, began)
            one_by_one = []
            for segment in segments:
                one_by_one += [c async for c in session.speak(segment, temperature=0)]
            return streamed, stats, segments, one_by_one, heard

    streamed, stats, segments, one_by_one, heard = asyncio.run(main())
    assert " ".join(segments) == " ".join(TEXT.split())
    assert stats["segments"] == len(segments) >= 2 and stats["text_wait_ms"] == 0
    # A listener with a small jitter buffer hears no gap (the server's own estimate, a
    # listener with no buffer at all, is in stats["underruns"]).
    assert heard.underruns == ()
    assert {c.segment for c in streamed} == set(range(len(segments)))
    assert [c.index for c in streamed] == list(range(len(streamed)))
    assert b"".join(c.data for c in streamed) == b"".join(c.data for c in one_by_one)
    wait_until_idle(server)


async def _open_text_stream(ws_url, **speak):
    ws = await websockets.connect(ws_url)
    assert json.loads(await ws.recv())["type"] == "ready"
    await ws.send(json.dumps({"type": "speak", "text_stream": True, **speak}))
    started = await _next(ws, {"started"})
    assert started["text_stream"] is True
    return ws, started["stream_id"]


async def _next(ws, kinds, timeout_s=20.0):
    """The next text message of one of ``kinds`` (binary audio skipped)."""
    async with asyncio.timeout(timeout_s):
        while True:
            message = await ws.recv()
            if isinstance(message, str) and json.loads(message)["type"] in kinds:
                return json.loads(message)


async def _until_done(ws, stream_id):
    """Every text message up to the stream's ``done``, and the audio bytes before it."""
    messages, audio = [], 0
    async with asyncio.timeout(30):
        while True:
            message = await ws.recv()
            if isinstance(message, bytes):
                audio += len(message) - 12
                continue
            event = json.loads(message)
            messages.append(event)
            if event["type"] == "done" and event["stream_id"] == stream_id:
                return messages, audio


def test_flush_speaks_what_has_arrived_and_text_end_ends_the_stream(ws_url, server):
    async def main():
        ws, stream_id = await _open_text_stream(ws_url, text="Hello there my good")
        try:
            await ws.send(json.dumps({"type": "text", "stream_id": stream_id, "text": " friend"}))
            await ws.send(json.dumps({"type": "flush", "stream_id": stream_id}))
            first = await _next(ws, {"segment"}, timeout_s=0.5)  # not the wait limit
            await ws.send(json.dumps({"type": "text", "stream_id": stream_id, "text": "and bye"}))
            await ws.send(json.dumps({"type": "text_end", "stream_id": stream_id}))
            return first, *await _until_done(ws, stream_id)
        finally:
            await ws.close()

    first, messages, audio = asyncio.run(main())
    assert first["text"] == "Hello there my good friend" and first["index"] == 0
    assert [m["text"] for m in messages if m["type"] == "segment"] == ["and bye"]
    done = messages[-1]
    assert done["reason"] == "eos" and done["stats"]["segments"] == 2
    assert audio >= 24000 * 2  # the second segment: at least a second of 16-bit samples
    wait_until_idle(server)


def test_text_sent_before_started_is_kept(ws_url, server):
    async def main():
        ws = await websockets.connect(ws_url)
        try:
            assert json.loads(await ws.recv())["type"] == "ready"
            for message in (
                {"type": "speak", "text_stream": True},
                {"type": "text", "stream_id": 1, "text": "Sent before the stream started."},
                {"type": "text_end", "stream_id": 1},
            ):
                await ws.send(json.dumps(message))  # without waiting for started
            return await _until_done(ws, 1)
        finally:
            await ws.close()

    messages, audio = asyncio.run(main())
    assert [m["type"] for m in messages if m["type"] != "queued"] == ["started", "segment", "done"]
    assert messages[-1]["reason"] == "eos" and audio > 0
    wait_until_idle(server)


def test_text_that_comes_late_is_waited_for_in_silence_and_is_no_underrun(ws_url, server):
    async def main():
        ws, stream_id = await _open_text_stream(ws_url, text="A first sentence here. ")
        try:
            await _next(ws, {"segment"})
            await asyncio.sleep(2.5)  # its 1.6 s of audio are long over
            text = {"type": "text", "stream_id": stream_id, "text": "And a second one."}
            await ws.send(json.dumps(text))
            await ws.send(json.dumps({"type": "text_end", "stream_id": stream_id}))
            return await _until_done(ws, stream_id)
        finally:
            await ws.close()

    messages, _ = asyncio.run(main())
    stats = messages[-1]["stats"]
    assert messages[-1]["reason"] == "eos" and stats["segments"] == 2
    assert stats["underruns"] == 0 and stats["text_wait_ms"] > 300
    wait_until_idle(server)


def test_a_stream_without_text_for_the_idle_timeout_ends_with_text_timeout(ws_url, server):
    async def main():
        ws, stream_id = await _open_text_stream(ws_url, text="Only this. ")
        try:
            began = time.monotonic()
            messages, _ = await _until_done(ws, stream_id)
            return messages, time.monotonic() - began
        finally:
            await ws.close()

    messages, took_s = asyncio.run(main())
    assert messages[-1]["reason"] == "text_timeout" and messages[-1]["stats"]["underruns"] == 0
    assert IDLE_TIMEOUT_S <= took_s < IDLE_TIMEOUT_S + 5
    wait_until_idle(server)


def test_cancel_mid_segment_ends_the_stream_and_frees_everything(ws_url, server):
    async def main():
        ws, stream_id = await _open_text_stream(ws_url, text="x " * 150 + ". ")
        try:
            while not isinstance(await ws.recv(), bytes):
                pass
            await ws.send(json.dumps({"type": "text", "stream_id": stream_id, "text": "More."}))
            await ws.send(json.dumps({"type": "cancel"}))
            done = await _next(ws, {"done"})
            await ws.send(json.dumps({"type": "text", "stream_id": stream_id, "text": "late"}))
            late = await _next(ws, {"error"})
            return done, late
        finally:
            await ws.close()

    done, late = asyncio.run(main())
    assert done["reason"] == "cancelled"
    assert late["code"] == "unknown_stream"
    wait_until_idle(server)


def test_malformed_text_messages_get_their_errors_and_the_stream_goes_on(ws_url, server):
    async def main():
        ws, stream_id = await _open_text_stream(ws_url, text="")
        errors = []
        try:
            for message, code in (
                ({"type": "text", "stream_id": stream_id + 7, "text": "hi"}, "unknown_stream"),
                ({"type": "flush", "stream_id": stream_id + 7}, "unknown_stream"),
                ({"type": "text_end", "stream_id": stream_id + 7}, "unknown_stream"),
                ({"type": "text", "stream_id": stream_id, "text": 5}, "invalid_message"),
                ({"type": "text", "stream_id": stream_id}, "invalid_message"),
                ({"type": "text", "stream_id": "1", "text": "a"}, "invalid_message"),
                ({"type": "text", "stream_id": stream_id, "text": "y" * 5000}, "text_too_long"),
                ({"type": "speak", "text": "busy"}, "busy"),
            ):
                await ws.send(json.dumps(message))
                error = await _next(ws, {"error"})
                assert error["code"] == code, (message, error)
                errors.append(error)
            text = {"type": "text", "stream_id": stream_id, "text": "Still here."}
            await ws.send(json.dumps(text))
            await ws.send(json.dumps({"type": "text_end", "stream_id": stream_id}))
            await ws.send(json.dumps(text))
            after_end = await _next(ws, {"error"})
            messages, audio = await _until_done(ws, stream_id)
            await ws.send(json.dumps({"type": "speak", "voice": "default"}))
            no_text = await _next(ws, {"error"})
            await ws.send(json.dumps(text))
            nothing_plays = await _next(ws, {"error"})
            return errors, after_end, messages, audio, no_text, nothing_plays
        finally:
            await ws.close()

    errors, after_end, messages, audio, no_text, nothing_plays = asyncio.run(main())
    assert errors[0]["stream_id"] == errors[0]["stream_id"]
    assert after_end["code"] == "text_ended"
    assert [m["type"] for m in messages].count("done") == 1
    assert messages[-1]["reason"] == "eos" and audio > 0
    assert no_text["code"] == "invalid_message" and "text" in no_text["message"]
    assert nothing_plays["code"] == "unknown_stream"
    wait_until_idle(server)


def test_the_sdk_raises_what_the_text_source_raises_and_cancels_the_stream(ws_url, server):
    async def failing():
        yield "A sentence that starts. "
        await asyncio.sleep(0.3)
        raise RuntimeError("the language model failed")

    async def main():
        async with connect(ws_url) as session:
            with pytest.raises(RuntimeError, match="language model"):
                async for _ in session.speak_stream(failing()):
                    pass
            # The session goes on.
            return [c async for c in session.speak("x" * 14)]

    assert asyncio.run(main())
    wait_until_idle(server)


def test_a_text_stream_refused_by_admission_says_why(ws_url, server):
    async def main():
        async with connect(ws_url) as session:
            with pytest.raises(StreamError) as refused:
                async for _ in session.speak_stream(_words("Hi.", 10), voice="nobody"):
                    pass
            return refused.value

    assert asyncio.run(main()).code == "voice_not_found"


def test_words_streamed_over_webrtc_play_as_one_stream(server):
    async def main():
        peer = WebRTCPeer(server.url)
        try:
            await peer.connect()
            peer.send({"type": "speak", "text_stream": True, "temperature": 0})
            started = await peer.next_event({"started", "error"})
            stream_id = started["stream_id"]
            async for word in _words(TEXT, 20):
                peer.send({"type": "text", "stream_id": stream_id, "text": word})
            peer.send({"type": "text_end", "stream_id": stream_id})
            segments = []
            while True:
                event = await peer.next_event({"segment", "done", "error"})
                if event["type"] != "segment":
                    break
                segments.append(event["text"])
            return started, segments, event, peer.result.loud_samples()
        finally:
            await peer.close()

    started, segments, done, loud = asyncio.run(main())
    assert started["text_stream"] is True
    assert done["type"] == "done" and done["reason"] == "eos"
    assert " ".join(segments) == " ".join(TEXT.split())
    assert done["stats"]["segments"] == len(segments) and done["stats"]["underruns"] == 0
    assert done["stats"]["audio_s"] >= 11.9 and loud > 10_000
    wait_until_idle(server)


def test_barge_in_on_a_text_stream_over_webrtc_stops_it_at_once(server):
    async def main():
        peer = WebRTCPeer(server.url)
        try:
            await peer.connect()
            peer.send({"type": "speak", "text_stream": True, "text": TEXT})
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
    assert done["reason"] == "cancelled" and after == before
    wait_until_idle(server)
