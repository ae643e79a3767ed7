"""A stream survives the loss of its whole node: two real nodes behind a real HAProxy, stream
checkpoints in a real Redis. An SDK stream through the front door has its node SIGKILLed
(edge and engines, the process group) mid-utterance; the SDK reconnects through the door,
resumes on the other node, and the audio it yields equals the uninterrupted stream's, sample
for sample (greedy, and seeded sampling)."""

from __future__ import annotations

import asyncio
import json
import time

import pytest
import redis
import websockets

from cadenza.client.sdk import connect
from cadenza.client.webrtc import WebRTCPeer
from cadenza.cluster.haproxy_config import render_haproxy_config
from tests.support.fleet import Fleet
from tests.support.haproxy_process import running_haproxy
from tests.support.ports import free_port
from tests.support.redis_process import running_redis

pytestmark = pytest.mark.timeout(300)

TEXT = "x" * 84  # six seconds of audio


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    directory = tmp_path_factory.mktemp("node-loss")
    with running_redis(directory) as redis:
        fleet = Fleet(directory, redis.url)
        try:
            port = free_port()
            with running_haproxy(render_haproxy_config(fleet.door(port)), directory, [port]):
                yield fleet, f"ws://127.0.0.1:{port}/v1/stream", redis
        finally:
            fleet.stop()


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
        assert len(audio) == len(reference)
        assert audio == reference  # no sample repeated, none missing, none different
    finally:
        nodes.restart(lost)  # the fleet whole again for what follows


def test_a_webrtc_utterance_completes_on_the_other_node_when_its_node_dies(fleet) -> None:
    """The aiortc peer hears its node go silent, offers again through the front door and
    resumes from what its track had played; the utterance completes."""
    nodes, url, _ = fleet
    door = url.replace("ws://", "http://").removesuffix("/v1/stream")

    async def main() -> tuple[dict, int, str]:
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

    async def main() -> dict:
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
    left = redis.Redis(port=redis_server.port).keys("cadenza:stream:*:head")
    assert left == []
