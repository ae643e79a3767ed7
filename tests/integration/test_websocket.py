"""``WS /v1/stream`` with the real server and the SDK (and raw ``websockets`` for garbage)."""

from __future__ import annotations

import asyncio
import json
import time

import numpy as np
import pytest
import websockets

from cadenza.client import StreamError, connect, speak_sync
from cadenza.edge.media.opus import OpusPacketDecoder
from cadenza.edge.streams import protocol
from tests.integration.server import serving, wait_until_idle

IDLE_TIMEOUT_S = 2.0


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    env = {"CADENZA_SERVER__WS_IDLE_TIMEOUT_S": str(IDLE_TIMEOUT_S)}
    with serving(tmp_path_factory.mktemp("ws") / "server.log", env) as running:
        running.idle_tasks = running.metric("cadenza_edge_asyncio_tasks")
        yield running


@pytest.fixture
def ws_url(server):
    return server.url.replace("http", "ws") + "/v1/stream"


async def _collect(session, text, **options):
    return [chunk async for chunk in session.speak(text, **options)]


def test_every_format_has_the_right_amount_of_audio(ws_url, server):
    async def main():
        async with connect(ws_url) as session:
            assert session.ready["protocol"] == 1 and session.ready["voices"] == ["default"]
            results = {}
            for fmt, rate in (
                ("pcm", None),
                ("pcm", 48000),
                ("pcm", 16000),
                ("opus", None),
                ("encodec", None),
            ):
                chunks = await _collect(session, "x" * 28, format=fmt, sample_rate=rate, seed=3)
                assert [c.index for c in chunks] == list(range(len(chunks)))
                results[(fmt, rate)] = (chunks, session.last_stats)
            return results

    results = asyncio.run(main())
    for rate in (24000, 48000, 16000):
        chunks, stats = results[("pcm", None if rate == 24000 else rate)]
        assert sum(len(c.data) for c in chunks) == 2 * rate * 2  # 2 s of 16-bit samples
        assert chunks[0].sample_rate == rate
        assert stats["audio_s"] == 2.0 and stats["ttfa_ms"] > 0
    opus_chunks, _ = results[("opus", None)]
    assert len(opus_chunks) == 100  # 20 ms packets
    decoder = OpusPacketDecoder()
    audio = np.concatenate([decoder.decode(c.data) for c in opus_chunks])
    assert audio.size == 96000 and np.abs(audio).max() > 0.01
    codes_chunks, _ = results[("encodec", None)]
    codes = np.frombuffer(b"".join(c.data for c in codes_chunks), "<u2").reshape(-1, 8)
    assert codes.shape == (150, 8) and codes.max() < 1024
    wait_until_idle(server)


def test_same_seed_same_audio_over_the_sdk_sync_helper(ws_url):
    first = speak_sync(ws_url, "hello", seed=11)
    second = speak_sync(ws_url, "hello", seed=11)
    assert first == second and len(first) == 75 * 320 * 2


def test_many_sessions_at_once(ws_url, server):
    async def one(index):
        async with connect(ws_url) as session:
            chunks = await _collect(session, "x" * (14 + 7 * index), seed=index)
            return sum(len(c.data) for c in chunks)

    async def main():
        return await asyncio.gather(*(one(i) for i in range(6)))

    sizes = asyncio.run(main())
    assert sizes == [round(max((14 + 7 * i) / 14, 1) * 75) * 320 * 2 for i in range(6)]
    wait_until_idle(server)


def test_cancel_and_leaving_the_loop_free_the_stream(ws_url, server):
    async def main():
        async with connect(ws_url) as session:
            stream = session.speak("x" * 3000, max_duration_s=60)
            await anext(stream)
            await stream.aclose()  # sends cancel, waits for done
            chunks = await _collect(session, "after")  # the session is usable again
            return chunks

    assert asyncio.run(main())
    wait_until_idle(server)


def test_client_that_vanishes_mid_stream_frees_its_stream(ws_url, server):
    async def main():
        async with websockets.connect(ws_url) as raw:
            await raw.recv()  # ready
            await raw.send(json.dumps({"type": "speak", "text": "x" * 3000, "max_duration_s": 60}))
            while isinstance(await raw.recv(), str):
                pass  # started; stop at the first audio frame and hang up

    asyncio.run(main())
    wait_until_idle(server)


@pytest.mark.parametrize(
    ("message", "code"),
    [
        ("{not json", "invalid_json"),
        ("[1, 2]", "invalid_json"),
        ('{"type": "dance"}', "unknown_type"),
        ('{"type": "speak"}', "invalid_message"),
        ('{"type": "speak", "text": 5}', "invalid_message"),
        ('{"type": "speak", "text": "hi", "format": "mp3"}', "invalid_message"),
        ('{"type": "speak", "text": "hi", "bogus": true}', "invalid_message"),
        ('{"type": "speak", "text": "hi", "voice": "alloy"}', "voice_not_found"),
        ('{"type": "speak", "text": "hi", "sample_rate": 44100}', "invalid_sample_rate"),
        (
            '{"type": "speak", "text": "hi", "format": "opus", "sample_rate": 24000}',
            "invalid_sample_rate",
        ),
        ('{"type": "speak", "text": "hi", "max_duration_s": -1}', "invalid_duration"),
        (json.dumps({"type": "speak", "text": "x" * 4097}), "input_too_long"),
        (b"\x00\x01garbage", "unexpected_binary"),
        ('{"type": "resume", "token": "nope", "samples_heard": 0}', "invalid_message"),
        (  # a server without checkpoints (limits.redis_url) resumes nothing
            json.dumps({"type": "resume", "token": "t" * 32, "samples_heard": 0}),
            "resume_unavailable",
        ),
    ],
)
def test_bad_messages_get_errors_and_the_session_goes_on(ws_url, message, code):
    async def main():
        async with websockets.connect(ws_url) as raw:
            await raw.recv()
            await raw.send(message)
            error = json.loads(await raw.recv())
            assert error["type"] == "error" and error["code"] == code and error["message"]
            await raw.send(json.dumps({"type": "ping", "data": "still here"}))
            assert json.loads(await raw.recv()) == {"type": "pong", "data": "still here"}

    asyncio.run(main())


def test_a_second_speak_while_playing_is_busy(ws_url, server):
    async def main():
        async with websockets.connect(ws_url) as raw:
            await raw.recv()
            await raw.send(json.dumps({"type": "speak", "text": "x" * 300}))
            await raw.send(json.dumps({"type": "speak", "text": "again"}))
            codes = set()
            while True:
                message = await raw.recv()
                if isinstance(message, bytes):
                    protocol.decode_audio_frame(message)
                    continue
                event = json.loads(message)
                if event["type"] == "error":
                    codes.add(event["code"])
                    await raw.send(json.dumps({"type": "cancel"}))
                if event["type"] == "done":
                    assert event["reason"] == "cancelled"
                    return codes

    assert asyncio.run(main()) == {"busy"}
    wait_until_idle(server)


def test_idle_sessions_are_closed(ws_url):
    async def main():
        async with websockets.connect(ws_url) as raw:
            await raw.recv()
            started = time.monotonic()
            error = json.loads(await raw.recv())
            assert error["code"] == "idle_timeout"
            with pytest.raises(websockets.ConnectionClosed) as closed:
                await raw.recv()
            assert closed.value.rcvd.code == 4000
            return time.monotonic() - started

    assert asyncio.run(main()) >= IDLE_TIMEOUT_S * 0.9


def test_audio_is_not_deflated_even_for_a_client_that_offers_it(ws_url):
    async def main():
        async with websockets.connect(ws_url) as raw:  # offers permessage-deflate
            await raw.recv()
            offered = raw.request.headers.get("Sec-WebSocket-Extensions")
            return offered, raw.response.headers.get("Sec-WebSocket-Extensions")

    offered, accepted = asyncio.run(main())
    assert offered and "permessage-deflate" in offered
    assert accepted is None


def test_oversize_message_closes_the_connection(ws_url):
    async def main():
        async with websockets.connect(ws_url, max_size=None) as raw:
            await raw.recv()
            await raw.send("x" * 70_000)
            with pytest.raises(websockets.ConnectionClosed) as closed:
                await raw.recv()
            return closed.value.rcvd.code

    assert asyncio.run(main()) == 1009  # message too big


def test_microphone_audio_becomes_the_speech_prompt(ws_url, server):
    rate = 16000
    tone = (0.3 * np.sin(np.arange(rate) / rate * 2 * np.pi * 200) * 32767).astype("<i2")

    async def main():
        async with connect(ws_url) as session:
            with pytest.raises(StreamError) as caught:
                await _collect(session, "hi", use_audio_prompt=True)  # nothing recorded yet
            assert caught.value.code == "no_prompt_audio"
            await session.send_microphone(tone.tobytes(), sample_rate=rate)
            chunks = await _collect(session, "x" * 14, use_audio_prompt=True, seed=1)
            with pytest.raises(StreamError):  # the prompt was consumed
                await _collect(session, "again", use_audio_prompt=True)
            return sum(len(c.data) for c in chunks)

    assert asyncio.run(main()) == 75 * 320 * 2
    wait_until_idle(server)


def test_malformed_microphone_audio(ws_url):
    async def main():
        async with websockets.connect(ws_url) as raw:
            await raw.recv()
            await raw.send(json.dumps({"type": "audio_in", "format": "pcm", "sample_rate": 16000}))
            await raw.send(b"\x01\x02\x03")  # a torn 16-bit sample
            first = json.loads(await raw.recv())
            await raw.send(json.dumps({"type": "audio_in", "sample_rate": 44100}))
            second = json.loads(await raw.recv())
            return first["code"], second["code"]

    assert asyncio.run(main()) == ("invalid_audio", "invalid_message")


def test_sdk_raises_stream_error(ws_url):
    async def main():
        async with connect(ws_url) as session:
            with pytest.raises(StreamError) as caught:
                await _collect(session, "hi", voice="nobody")
            return caught.value.code

    assert asyncio.run(main()) == "voice_not_found"
