"""Two real cadenza nodes behind a real HAProxy configured by ``cadenza haproxy-config``: both
serve through the one address, the SDK and an aiortc peer work through it, a node capped by
``admission.max_streams`` takes no more than its cap while the other has room, with both full
a client gets the documented refusal or waits in a queue, and a drained node gets no new
streams while its open ones finish."""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from cadenza.client.sdk import connect
from cadenza.client.webrtc import WebRTCPeer
from cadenza.cluster.haproxy_config import FrontDoor, render_haproxy_config
from cadenza.cluster.node_address import parse_address, parse_node
from tests.integration.server import RunningServer
from tests.support.haproxy_process import running_haproxy
from tests.support.ports import free_port

DETERMINISTIC = {"CADENZA_CALIBRATION__MODE": "off", "CADENZA_ADMISSION__SLACK_CLOSE_MS": "-1e9"}
LONG = {"model": "cadenza-tiny", "input": "x" * 42, "response_format": "pcm"}  # 3 s
REALTIME = {**LONG, "priority": "realtime"}  # refused at once when full, not queued
CAPS = {"a": 2, "b": 4}
REFUSALS = {"queue_full", "queue_timeout", "at_capacity"}  # docs/protocol.md, 503 for capacity


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """Node ``a`` capped at 2 streams, node ``b`` at 4, and the front door's URL."""
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
            yield url, nodes
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
    url, _ = cluster

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
    url, _ = cluster

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


def test_with_every_node_full_clients_get_the_documented_refusal_or_queue(cluster) -> None:
    """Six ten-second streams fill both nodes (``realtime``: one refused by a full node is
    resent to the other, so each node ends up at its cap). Then another ``realtime`` stream,
    refused by a node and again by the other, gets that node's 503 with its code and
    ``Retry-After`` (not an error of HAProxy's own); a ``standard`` one waits in a node's
    queue and plays once a stream there ends (docs/protocol.md)."""
    url, _ = cluster
    ten_seconds = {**LONG, "input": "x" * 140}

    def stream(priority: str) -> tuple[int, str | None, str | None, float]:
        started = time.monotonic()
        body = {**ten_seconds, "priority": priority}
        with httpx.stream("POST", f"{url}/v1/audio/speech", json=body, timeout=60) as r:
            r.read()
            code = r.json()["error"]["code"] if r.status_code != 200 else None
            retry_after = r.headers.get("retry-after") if code else None
            return r.status_code, code, retry_after, time.monotonic() - started

    with ThreadPoolExecutor(max_workers=8) as pool:
        filling = [pool.submit(stream, "realtime") for _ in range(sum(CAPS.values()))]
        time.sleep(2.0)  # all six admitted and playing
        refused = pool.submit(stream, "realtime")
        queued = pool.submit(stream, "standard")
        status, code, retry_after, _ = refused.result()
        assert status == 503 and code in REFUSALS, (status, code)
        assert retry_after is not None and int(retry_after) >= 1
        assert [future.result()[0] for future in filling] == [200] * 6
        status, _, _, took_s = queued.result()
        assert status == 200 and took_s > 5.0  # it waited for a stream to end


def test_a_drained_node_gets_no_new_streams(cluster) -> None:
    """Last: the drain ends node ``a``. Its open stream finishes; new ones go to ``b``."""
    url, nodes = cluster

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
