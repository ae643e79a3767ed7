"""A stream survives the loss of its whole node: two real nodes behind a real HAProxy, stream
checkpoints in a real Redis (behind a password). An SDK stream through the front door has its
node SIGKILLed (edge and engines, the process group) mid-utterance; the SDK reconnects through
the door, resumes on the other node, and the audio it yields equals the uninterrupted
stream's, sample for sample to the codec's rounding (greedy, and seeded sampling). A stream
whose node still serves it is not taken by a resume of its token and plays on; its client,
once its connection dropped, resumes at once. Neither the Redis password nor the token secret
is on a process's command line or in a log."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import redis
import websockets

from cadenza.client.sdk import connect
from cadenza.client.webrtc import WebRTCPeer
from cadenza.cluster.haproxy_config import render_haproxy_config
from cadenza.edge.streams import protocol
from tests.support.fleet import TOKEN_SECRET, Fleet
from tests.support.haproxy_process import running_haproxy
from tests.support.ports import free_port
from tests.support.redis_process import running_redis

pytestmark = pytest.mark.timeout(300)

TEXT = "x" * 84  # six seconds of audio
REDIS_PASSWORD = "the-fleets-redis-password"


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    directory = tmp_path_factory.mktemp("node-loss")
    with running_redis(directory, password=REDIS_PASSWORD) as redis:
        fleet = Fleet(directory, redis.url)
        try:
            port = free_port()
            with running_haproxy(render_haproxy_config(fleet.door(port)), directory, [port]):
                yield fleet, f"ws://127.0.0.1:{port}/v1/stream", redis
        finally:
            fleet.stop()


# How far a resumed stream's 16-bit PCM may be from the uninterrupted stream's: the codec
# rebuilds its state from the frames the listener heard, decoded in other chunks than the first
# time, and a float32 convolution's rounding can follow its width (one step at most measured on
# a Xeon with AMX; none on an EPYC). A repeated, missing or shifted sample, or a state rebuilt
# wrong, is thousands of steps off.
PCM_ROUNDING = 2


def assert_same_audio(audio: bytes, reference: bytes) -> None:
    """``audio`` is ``reference``: no sample repeated, none missing, none different beyond the
    codec's rounding (:data:`PCM_ROUNDING`)."""
    assert len(audio) == len(reference)
    got = np.frombuffer(audio, dtype=np.int16).astype(np.int32)
    expected = np.frombuffer(reference, dtype=np.int16).astype(np.int32)
    assert int(np.abs(got - expected).max(initial=0)) <= PCM_ROUNDING


async def _speak(url: str, **options) -> tuple[bytes, str, int]:
    """The utterance's PCM, the node that started it, and the session's resumes."""
    async with connect(url) as session:
        node = session.ready["node"]
        audio = b"".join([c.data async for c in session.speak(TEXT, format="pcm", **options)])
        return audio, node, session.resumes


async def _speak_losing_the_node(fleet: Fleet, url: str, **options) -> tuple[bytes, str, int]:
    """The same, the node SIGKILLed once a second of audio has arrived."""
    async with connect(url) as session:
        node = session.ready["node"]
        chunks: list[bytes] = []
        killed = False
        async for chunk in session.speak(TEXT, format="pcm", **options):
            chunks.append(chunk.data)
            if not killed and sum(map(len, chunks)) >= 2 * 24000:
                fleet.nodes[node].kill_group()
                killed = True
        return b"".join(chunks), node, session.resumes


@pytest.mark.parametrize("options", [{"temperature": 0.0}, {"seed": 7}], ids=["greedy", "seeded"])
def test_a_stream_goes_on_on_the_other_node_when_its_node_dies(fleet, options) -> None:
    nodes, url, _ = fleet
    reference, _, _ = asyncio.run(_speak(url, **options))
    audio, lost, resumes = asyncio.run(_speak_losing_the_node(nodes, url, **options))
    try:
        assert resumes == 1
        assert_same_audio(audio, reference)
    finally:
        nodes.restart(lost)  # the fleet whole again for what follows


def test_a_webrtc_utterance_completes_on_the_other_node_when_its_node_dies(fleet) -> None:
    """The aiortc peer hears its node go silent, offers again through the front door and
    resumes from what its track had played; the utterance completes."""
    nodes, url, _ = fleet
    door = url.replace("ws://", "http://").removesuffix("/v1/stream")

    async def main() -> tuple[dict[str, Any], int, str]:
        peer = WebRTCPeer(door)
        try:
            await peer.connect()
            node = peer.node
            assert node is not None
            speaking = asyncio.create_task(peer.speak({"type": "speak", "text": TEXT}))
            while sum(len(s) for s in peer.result.samples) < 48000 and not speaking.done():
                await asyncio.sleep(0.05)
            nodes.nodes[node].kill_group()
            done = await speaking
            await asyncio.sleep(0.3)
            return done, peer.resumes, node
        finally:
            await peer.close()

    done, resumes, lost = asyncio.run(main())
    try:
        assert done["type"] == "done", done
        assert resumes == 1
    finally:
        nodes.restart(lost)


@pytest.mark.parametrize(
    ("resume", "code"),
    [
        ({"token": "A" * 32, "samples_heard": 0}, "resume_not_found"),
        ({"token": "A" * 32, "frames_heard": 3}, "resume_not_found"),
        ({"token": "A" * 8, "samples_heard": 0}, "invalid_message"),
    ],
)
def test_a_token_no_stream_has_is_refused_and_the_session_goes_on(fleet, resume, code) -> None:
    _, url, _ = fleet

    async def main() -> dict[str, Any]:
        async with websockets.connect(url) as raw:
            await raw.recv()  # ready
            await raw.send(json.dumps({"type": "resume", **resume}))
            error = json.loads(await raw.recv())
            await raw.send(json.dumps({"type": "ping"}))
            assert json.loads(await raw.recv())["type"] == "pong"
            return error

    error = asyncio.run(main())
    assert error["type"] == "error" and error["code"] == code, error


def test_nothing_of_a_finished_stream_is_left_in_redis(fleet) -> None:
    _, url, redis_server = fleet
    asyncio.run(_speak(url, temperature=0.0))
    time.sleep(0.3)  # the delete is sent as the stream ends, not waited for
    client = redis.Redis(port=redis_server.port, password=redis_server.password)
    assert client.keys("cadenza:stream:*:head") == []
    assert client.keys("cadenza:stream:*:live") == []


async def _started(raw, **speak) -> dict[str, Any]:
    """``speak`` sent on ``raw`` (after its ``ready``); its ``started``."""
    await raw.recv()  # ready
    await raw.send(json.dumps({"type": "speak", "text": TEXT, "format": "pcm", **speak}))
    while True:
        message = await raw.recv()
        if isinstance(message, str) and json.loads(message)["type"] == "started":
            return json.loads(message)


async def _pcm_until(raw, limit: int | None = None):
    """The PCM ``raw`` receives until ``done`` or ``error`` (its last message) or until
    ``limit`` bytes; and that last message (``None`` at the limit)."""
    audio = b""
    while limit is None or len(audio) < limit:
        message = await raw.recv()
        if isinstance(message, bytes):
            audio += protocol.decode_audio_frame(message).payload
        elif json.loads(message)["type"] in ("done", "error"):
            return audio, json.loads(message)
    return audio, None


def test_a_resume_of_a_stream_that_still_plays_is_refused_and_it_plays_on(fleet) -> None:
    """A leaked token: its stream's node still serves it (a WebRTC track plays in real time,
    so for as long as its audio lasts), so a resume of it is refused, and the stream plays on
    to its end where it was."""
    _, url, _ = fleet
    door = url.replace("ws://", "http://").removesuffix("/v1/stream")

    async def main() -> tuple[dict[str, Any], dict[str, Any], int]:
        peer = WebRTCPeer(door)
        try:
            await peer.connect()
            speaking = asyncio.create_task(peer.speak({"type": "speak", "text": "x" * 140}))
            token = None
            while (token is None or peer.result.loud_samples() < 24000) and not speaking.done():
                started = [e for e in peer.result.events if e["type"] == "started"]
                token = started[0].get("resume_token") if started else None
                await asyncio.sleep(0.05)
            assert token is not None
            async with websockets.connect(url) as thief:
                await thief.recv()  # ready
                await thief.send(json.dumps({"type": "resume", "token": token, "samples_heard": 0}))
                refusal = json.loads(await thief.recv())
            assert not speaking.done()  # still playing after the refusal
            done = await speaking
            return refusal, done, peer.resumes
        finally:
            await peer.close()

    refusal, done, resumes = asyncio.run(main())
    assert refusal["type"] == "error" and refusal["code"] == "resume_live", refusal
    assert done["type"] == "done" and resumes == 0, done


def test_a_client_whose_connection_dropped_resumes_at_once(fleet) -> None:
    """The node sees the connection go and lets the stream go with it: the client, back
    through the door, resumes without waiting for anything to expire."""
    _, url, _ = fleet
    reference, _, _ = asyncio.run(_speak(url, temperature=0.0))

    async def main() -> tuple[bytes, dict[str, Any], float, bytes, dict[str, Any] | None]:
        async with websockets.connect(url, max_size=None) as first:
            started = await _started(first, temperature=0.0)
            heard, _ = await _pcm_until(first, limit=2 * 24000)  # a second of audio
        dropped_at = time.monotonic()
        async with websockets.connect(url, max_size=None) as again:
            await again.recv()  # ready
            resume = {
                "type": "resume",
                "token": started["resume_token"],
                "samples_heard": len(heard) // 2,
            }
            await again.send(json.dumps(resume))
            resumed = json.loads(await again.recv())
            waited = time.monotonic() - dropped_at
            rest, last = await _pcm_until(again)
        return heard, resumed, waited, rest, last

    heard, resumed, waited, rest, last = asyncio.run(main())
    assert resumed["type"] == "started" and resumed.get("resumed") is True, resumed
    assert waited < 2.0  # no live marker to wait out (it lives 3 s)
    assert last is not None and last["type"] == "done", last
    assert_same_audio(heard + rest, reference)


def test_no_secret_is_on_a_command_line_or_in_a_log(fleet) -> None:
    nodes, _, redis_server = fleet
    assert REDIS_PASSWORD in redis_server.url  # the nodes were given it
    engines = [pid for node in nodes.nodes.values() for pid in node.engine_pids()]
    assert engines
    for pid in engines:
        command = Path(f"/proc/{pid}/cmdline").read_bytes()
        assert REDIS_PASSWORD.encode() not in command
        assert TOKEN_SECRET.encode() not in command
    for node_log in nodes.directory.glob("node-*.log"):
        text = node_log.read_text(errors="replace")
        assert REDIS_PASSWORD not in text and TOKEN_SECRET not in text, node_log
