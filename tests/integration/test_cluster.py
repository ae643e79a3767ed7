"""Two real cadenza nodes behind a real HAProxy configured by ``cadenza haproxy-config``: both
serve through the one address, the SDK and an aiortc peer work through it, a node capped by
``admission.max_streams`` takes no more than its cap while the other has room, a burst of SDK
sessions as large as the fleet's claim starts every stream at once (a full node refuses the
upgrade and HAProxy places the session on the other), an utterance a full node refuses is
sent to the node with room, with both full a client gets the documented refusal or waits in
a queue, and a drained node gets no new streams while its open ones finish."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
import websockets

from cadenza.client.sdk import connect
from cadenza.client.webrtc import WebRTCPeer
from cadenza.cluster.haproxy_config import FrontDoor, render_haproxy_config
from cadenza.cluster.node_address import parse_address, parse_node
from tests.integration.server import RunningServer
from tests.support.haproxy_process import running_haproxy
from tests.support.ports import free_port

# A queued standard stream may wait behind two ten-second streams where a slow machine's
# probes lower a node's claim below its cap: the wait allowed is longer than the default 30 s.
DETERMINISTIC = {
    "CADENZA_CALIBRATION__MODE": "off",
    "CADENZA_ADMISSION__SLACK_CLOSE_MS": "-1e9",
    "CADENZA_ADMISSION__STANDARD_MAX_WAIT_S": "90",
}
LONG = {"model": "cadenza-tiny", "input": "x" * 42, "response_format": "pcm"}  # 3 s
REALTIME = {**LONG, "priority": "realtime"}  # refused at once when full, not queued
CAPS = {"a": 2, "b": 4}
REFUSALS = {"queue_full", "queue_timeout", "at_capacity"}  # docs/protocol.md, 503 for capacity
SPILL = {"X-Cadenza-Spill": "1"}  # docs/protocol.md: refuse the upgrade if no stream fits now


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """The front door's URL, node ``a`` capped at 2 streams and node ``b`` at 4, and their
    agents' ports."""
    tmp = tmp_path_factory.mktemp("cluster")
    agents = {"a": free_port(), "b": free_port()}
    caps = {name: {"CADENZA_ADMISSION__MAX_STREAMS": str(cap)} for name, cap in CAPS.items()}
    nodes = {
        name: RunningServer(
            tmp / f"node-{name}.log",
            {**DETERMINISTIC, **caps[name]},
            args=("--node-id", name, "--agent-port", str(agents[name])),
        )
        for name in ("a", "b")
    }
    try:
        for node in nodes.values():
            node.wait_ready()
        port = free_port()
        door = FrontDoor(
            listen=parse_address(f"127.0.0.1:{port}", "--listen"),
            nodes=tuple(parse_node(f"127.0.0.1:{nodes[n].port}:{agents[n]}") for n in ("a", "b")),
        )
        with running_haproxy(render_haproxy_config(door), tmp, [port]):
            url = f"http://127.0.0.1:{port}"
            deadline = time.monotonic() + 20
            while not _both_serve(url):  # health checks and agents seen once each
                assert time.monotonic() < deadline, "the front door did not reach both nodes"
                time.sleep(0.5)
            yield url, nodes, agents
    finally:
        for node in nodes.values():
            node.stop()


def _both_serve(url: str) -> bool:
    seen = set()
    for _ in range(8):
        try:
            seen.add(httpx.get(f"{url}/v1/models", timeout=5).headers.get("x-cadenza-node"))
        except httpx.HTTPError:
            return False
    return seen == {"a", "b"}


def test_the_sdk_and_a_webrtc_peer_work_through_the_front_door(cluster) -> None:
    url, *_ = cluster

    async def main() -> tuple[str, int, int]:
        async with connect(url.replace("http://", "ws://") + "/v1/stream") as session:
            node = session.ready["node"]
            received = 0
            async for chunk in session.speak("x" * 28, format="pcm", seed=1):
                received += len(chunk.data)
        peer = WebRTCPeer(url)
        try:
            await peer.connect()
            peer.send({"type": "speak", "text": "x" * 28, "seed": 1})
            done = await peer.next_event({"done", "error"})
            await asyncio.sleep(0.3)
            assert done["type"] == "done", done
        finally:
            await peer.close()
        return node, received, peer.result.loud_samples()

    node, received, loud = asyncio.run(main())
    assert node in ("a", "b") and received > 0 and loud > 10_000


def test_a_capped_node_takes_its_cap_and_the_other_the_rest(cluster) -> None:
    """Six streams at once: every one admitted (HAProxy retries a node's refusal on the other
    before the client sees it), never more than two at a time on the capped node."""
    url, *_ = cluster

    def stream(_: int) -> tuple[int, str | None, float, float]:
        with httpx.stream("POST", f"{url}/v1/audio/speech", json=REALTIME, timeout=60) as response:
            started = time.monotonic()
            for _chunk in response.iter_bytes():
                pass
            node = response.headers.get("x-cadenza-node")
            return response.status_code, node, started, time.monotonic()

    with ThreadPoolExecutor(max_workers=6) as pool:
        answers = list(pool.map(stream, range(6)))
    assert [status for status, *_ in answers] == [200] * 6
    assert {node for _, node, *_ in answers} <= {"a", "b"}
    on_a = [(start, end) for _, node, start, end in answers if node == "a"]
    at_once = max((sum(1 for s, e in on_a if s <= t < e) for t, _ in on_a), default=0)
    assert at_once <= 2


def test_a_burst_of_sdk_sessions_as_large_as_the_fleet_starts_every_stream_at_once(cluster) -> None:
    """Six ``standard`` SDK streams at once through the front door, as many as the nodes claim
    (2 + 4), whatever HAProxy's weights say at that moment (an agent's answer is up to a
    second old): a node that could not start one more stream at once refuses the upgrade
    (503 ``at_capacity``, counting the sessions it accepted a moment before that have not
    spoken yet) and HAProxy places the session on the other. Every stream starts without
    waiting for another to end (before, a node given three sessions queued the third while
    the other had room), and the capped node holds exactly its two."""
    url, nodes, _ = cluster
    _wait_until_idle(nodes)
    ws_url = url.replace("http://", "ws://") + "/v1/stream"

    async def one() -> tuple[str, float, int]:
        async with connect(ws_url, open_timeout=30) as session:
            received = 0
            async for chunk in session.speak("x" * 84, priority="standard", seed=1):  # 6 s
                received += len(chunk.data)
            queued_s = float((session.last_started or {})["queued_s"])
            return session.ready["node"], queued_s, received

    async def burst() -> list[tuple[str, float, int]]:
        return list(await asyncio.gather(*(one() for _ in range(sum(CAPS.values())))))

    streams = asyncio.run(burst())
    assert all(queued_s < 1.0 and received > 0 for _, queued_s, received in streams), streams
    assert Counter(node for node, *_ in streams) == CAPS, streams


def test_an_utterance_its_full_node_refuses_plays_on_the_node_with_room(cluster) -> None:
    """An SDK session through the door on node X; then X fills (its cap of streams sent to it
    directly). A ``realtime`` utterance there, refused by X (``queue_timeout``), is sent once
    more on a new connection through the door that asks for a node with room: it plays on
    the other node and the client sees no refusal."""
    url, nodes, _ = cluster
    _wait_until_idle(nodes)
    ws_url = url.replace("http://", "ws://") + "/v1/stream"

    async def main() -> tuple[str, str, int, int]:
        async with connect(ws_url, open_timeout=30) as session:
            first = session.ready["node"]
            async with httpx.AsyncClient(timeout=60) as http, contextlib.AsyncExitStack() as held:
                for _ in range(CAPS[first]):
                    body = {**LONG, "input": "x" * 140}
                    request = http.stream("POST", f"{nodes[first].url}/v1/audio/speech", json=body)
                    response = await held.enter_async_context(request)
                    assert response.status_code == 200  # sent with its first audio: admitted
                received = 0
                async for chunk in session.speak("x" * 28, seed=1):
                    received += len(chunk.data)
            return first, session.ready["node"], session.spills, received

    first, second, spills, received = asyncio.run(main())
    assert second != first and spills == 1 and received > 0


def test_a_node_reserves_its_free_streams_for_new_sessions(cluster) -> None:
    """Straight to node ``a`` (cap 2): two sessions that have not spoken yet hold both its
    streams (its agent says 1%), so a third that asks to spill is refused before the upgrade
    with 503 ``at_capacity`` and ``Retry-After``; one that does not ask is accepted, as
    before. A spill header of any other value than 1 or 0 is 400 ``invalid_header``. Once
    the sessions close nothing stays reserved (the agent says 100% again)."""
    _, nodes, agents = cluster
    _wait_until_idle(nodes)
    node_a = nodes["a"].url.replace("http://", "ws://") + "/v1/stream"
    garbage = ["yes", "true", "2", "1,1", "0x1", "1" * 300, "-1"]

    async def main() -> tuple[str, object, list[object]]:
        sessions = [await websockets.connect(node_a, additional_headers=SPILL) for _ in range(2)]
        held = _agent_line(agents["a"])
        with pytest.raises(websockets.InvalidStatus) as refused:
            await websockets.connect(node_a, additional_headers=SPILL)
        sessions.append(await websockets.connect(node_a))  # no header: accepted as before
        invalid = []
        for value in garbage:
            with pytest.raises(websockets.InvalidStatus) as bad:
                await websockets.connect(node_a, additional_headers={"X-Cadenza-Spill": value})
            invalid.append(bad.value.response)
        for session in sessions:
            assert json.loads(await session.recv())["type"] == "ready"
            await session.close()
        return held, refused.value.response, invalid

    held, refused, invalid = asyncio.run(main())
    assert held == "up ready 1%"
    assert refused.status_code == 503 and int(refused.headers["Retry-After"]) >= 1
    assert json.loads(refused.body)["error"]["code"] == "at_capacity"
    for response in invalid:
        assert response.status_code == 400
        assert json.loads(response.body)["error"]["code"] == "invalid_header"
    deadline = time.monotonic() + 5
    while (line := _agent_line(agents["a"])) != "up ready 100%":
        assert time.monotonic() < deadline, f"a reservation stayed behind: {line}"
        time.sleep(0.2)


def _wait_until_idle(nodes: dict[str, RunningServer], timeout_s: float = 30.0) -> None:
    """Until neither node has a stream admitted or queued (earlier tests' streams ended)."""
    deadline = time.monotonic() + timeout_s
    while True:
        capacities = [httpx.get(f"{n.url}/v1/capacity", timeout=5).json() for n in nodes.values()]
        if all(c["active"] == 0 and c["queued"] == 0 for c in capacities):
            return
        assert time.monotonic() < deadline, "the nodes' streams did not end"
        time.sleep(0.3)


def _agent_line(port: int) -> str:
    """The node's agent-check answer, as HAProxy reads it."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as connection:
        return connection.makefile("rb").readline().decode("ascii").strip()


def test_with_every_node_full_clients_get_the_documented_refusal_or_queue(cluster) -> None:
    """Six ten-second streams fill both nodes (``realtime``: one refused by a full node is
    resent to the other, so each node ends up at its cap). Then another ``realtime`` stream,
    refused by a node and again by the other, gets that node's 503 with its code and
    ``Retry-After`` (not an error of HAProxy's own); a ``standard`` one waits in a node's
    queue and plays once a stream there ends (docs/protocol.md). So does a ``standard`` SDK
    stream: every node refuses its spilling upgrade, so it connects without asking and its
    utterance waits in that node's queue."""
    url, *_ = cluster
    ten_seconds = {**LONG, "input": "x" * 140}

    def stream(priority: str) -> tuple[int, str | None, str | None, float]:
        started = time.monotonic()
        body = {**ten_seconds, "priority": priority}
        with httpx.stream("POST", f"{url}/v1/audio/speech", json=body, timeout=60) as r:
            r.read()
            code = r.json()["error"]["code"] if r.status_code != 200 else None
            retry_after = r.headers.get("retry-after") if code else None
            return r.status_code, code, retry_after, time.monotonic() - started

    async def sdk_stream() -> tuple[bool, float]:
        started = time.monotonic()
        async with connect(url.replace("http://", "ws://") + "/v1/stream") as session:
            async for _chunk in session.speak("x" * 28, priority="standard"):
                pass
            return session.last_queued is not None, time.monotonic() - started

    with ThreadPoolExecutor(max_workers=9) as pool:
        filling = [pool.submit(stream, "realtime") for _ in range(sum(CAPS.values()))]
        time.sleep(2.0)  # all six admitted and playing
        refused = pool.submit(stream, "realtime")
        queued = pool.submit(stream, "standard")
        queued_sdk = pool.submit(asyncio.run, sdk_stream())
        status, code, retry_after, _ = refused.result()
        assert status == 503 and code in REFUSALS, (status, code)
        assert retry_after is not None and int(retry_after) >= 1
        assert [future.result()[0] for future in filling] == [200] * 6
        status, _, _, took_s = queued.result()
        assert status == 200 and took_s > 5.0  # it waited for a stream to end
        was_queued, took_s = queued_sdk.result()
        assert was_queued and took_s > 5.0


def test_a_drained_node_gets_no_new_streams(cluster) -> None:
    """Last: the drain ends node ``a``. Its open stream finishes; new ones go to ``b``."""
    url, nodes, _ = cluster

    def open_on_a() -> int:
        with httpx.stream("POST", f"{nodes['a'].url}/v1/audio/speech", json=LONG, timeout=60) as r:
            return sum(len(chunk) for chunk in r.iter_bytes())

    with ThreadPoolExecutor(max_workers=1) as pool:
        open_stream = pool.submit(open_on_a)
        time.sleep(0.5)
        assert httpx.post(f"{nodes['a'].url}/admin/drain", timeout=10).status_code == 202
        time.sleep(2.5)  # two agent intervals
        served_by = {
            httpx.post(
                f"{url}/v1/audio/speech", json={**LONG, "input": "hi"}, timeout=60
            ).headers.get("x-cadenza-node")
            for _ in range(6)
        }
        assert served_by == {"b"}
        assert open_stream.result(timeout=60) > 0
