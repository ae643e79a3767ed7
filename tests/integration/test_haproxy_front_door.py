"""Real HAProxy, with the configuration ``cadenza haproxy-config`` renders, in front of two
stub nodes and their agents (tests/support/stub_node.py): requests reach both nodes, a
refusal (503) is retried on the other node before the client sees it, a node whose agent
says ``drain`` gets no new requests, and ``/admin`` stays closed at the door."""

from __future__ import annotations

import http.client
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from cadenza.cluster.haproxy_config import FrontDoor, render_haproxy_config
from cadenza.cluster.node_address import Address, Node
from tests.support.haproxy_process import require_haproxy, running_haproxy
from tests.support.ports import free_port
from tests.support.stub_node import StubAgent, StubNode

pytestmark = pytest.mark.timeout(60)


@dataclass
class FrontedCluster:
    port: int
    stats_port: int
    nodes: dict[str, StubNode]
    agents: dict[str, StubAgent]

    def request(
        self,
        method: str = "POST",
        path: str = "/v1/audio/speech",
        body: bytes = b"",
        test_id: str = "",
    ) -> tuple[int, dict[str, str], bytes]:
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        try:
            headers = {"X-Test-Id": test_id, "Connection": "close"}
            connection.request(method, path, body=body, headers=headers)
            response = connection.getresponse()
            headers = {key.lower(): value for key, value in response.getheaders()}
            return response.status, headers, response.read()
        finally:
            connection.close()

    def served_by(self, count: int) -> list[str]:
        """Which node served each of ``count`` requests (each must succeed)."""
        names = []
        for _ in range(count):
            status, _, body = self.request(body=b"{}")
            assert status == 200, body
            names.append(body.split(b" ")[0].decode())
        return names

    def reset(self) -> None:
        for node in self.nodes.values():
            node.refuse_next(0)
            node.forget()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> Iterator[FrontedCluster]:
    require_haproxy()
    nodes = {name: StubNode(name) for name in ("a", "b")}
    agents = {name: StubAgent("up 50%") for name in nodes}
    port, stats_port = free_port(), free_port()
    front_door = FrontDoor(
        listen=Address("127.0.0.1", port),
        nodes=tuple(
            Node(Address("127.0.0.1", nodes[name].port), agents[name].port) for name in nodes
        ),
        stats=Address("127.0.0.1", stats_port),
    )
    directory = tmp_path_factory.mktemp("haproxy")
    try:
        with running_haproxy(render_haproxy_config(front_door), directory, [port, stats_port]):
            for agent in agents.values():
                agent.answer("up 50%", polls=1)  # both weights read before the first test
            yield FrontedCluster(port, stats_port, nodes, agents)
    finally:
        for node in nodes.values():
            node.stop()
        for agent in agents.values():
            agent.stop()


@pytest.fixture
def front(cluster) -> Iterator[FrontedCluster]:
    cluster.reset()
    yield cluster
    cluster.reset()


def test_requests_reach_both_nodes_with_the_client_address(front):
    assert set(front.served_by(6)) == {"a", "b"}
    seen = front.nodes["a"].served[0]
    assert seen.headers["x-forwarded-for"] == "127.0.0.1"
    assert seen.headers["x-forwarded-proto"] == "http"


def test_a_client_cannot_choose_the_address_the_nodes_see(front):
    connection = http.client.HTTPConnection("127.0.0.1", front.port, timeout=10)
    try:
        spoofed = {"X-Forwarded-For": "203.0.113.7", "X-Test-Id": "spoof", "Connection": "close"}
        connection.request("POST", "/v1/audio/speech", body=b"{}", headers=spoofed)
        assert connection.getresponse().status == 200
    finally:
        connection.close()
    [seen] = [s for node in front.nodes.values() for s in node.served if s.test_id == "spoof"]
    assert seen.headers["x-forwarded-for"] == "127.0.0.1"


def test_a_refusal_is_retried_on_the_other_node_before_the_client_sees_it(front):
    front.nodes["a"].refuse_next(1)
    for number in range(6):
        status, _, body = front.request(body=b'{"input": "hello"}', test_id=str(number))
        assert status == 200, body
        if front.nodes["a"].refused:
            break
    [refused] = front.nodes["a"].refused
    retried = [seen for seen in front.nodes["b"].served if seen.test_id == refused.test_id]
    assert [seen.body for seen in retried] == [b'{"input": "hello"}']
    assert body == b'b {"input": "hello"}'


def test_a_body_sent_after_its_headers_is_retried_too(front):
    """HAProxy resends only a request it holds whole: the body is waited for before a node is
    chosen (option http-buffer-request), so a client that sends its headers first still gets
    its retries, here two (both nodes refuse once), and its body arrives intact."""
    for node in front.nodes.values():
        node.refuse_next(1)
    body = b'{"input": "' + b"x" * 30000 + b'"}'
    head = (
        f"POST /v1/audio/speech HTTP/1.1\r\nHost: cadenza\r\nContent-Length: {len(body)}\r\n"
        "Content-Type: application/json\r\nConnection: close\r\n\r\n"
    )
    with socket.create_connection(("127.0.0.1", front.port), timeout=10) as sock:
        sock.sendall(head.encode())
        time.sleep(0.3)
        sock.sendall(body)
        response = b""
        while chunk := sock.recv(65536):
            response += chunk
    assert response.startswith(b"HTTP/1.1 200"), response[:200]
    assert response.endswith(body)
    assert sum(len(node.refused) for node in front.nodes.values()) == 2
    assert [len(seen.body) for node in front.nodes.values() for seen in node.served] == [len(body)]


def test_when_every_node_refuses_the_client_gets_a_nodes_own_refusal(front):
    for node in front.nodes.values():
        node.refuse_next(5)
    status, headers, body = front.request(body=b"{}")
    assert status == 503
    assert headers["retry-after"] == "1"
    assert b"queue_full" in body  # the node's answer, not HAProxy's own 503 page
    assert sum(len(node.refused) for node in front.nodes.values()) == 3  # retries 2


def test_a_drained_node_gets_no_new_requests_until_its_agent_says_ready(front):
    drained = front.agents["a"]
    try:
        drained.answer("drain")  # two agent intervals
        assert set(front.served_by(6)) == {"b"}
        drained.answer("up 50%")  # only "ready" ends a drain
        assert set(front.served_by(4)) == {"b"}
        drained.answer("ready up 50%")
        assert set(front.served_by(6)) == {"a", "b"}
    finally:
        drained.answer("ready up 50%", polls=1)


def _websocket_echo(front: FrontedCluster) -> bytes:
    """Upgrade through the front door, send a few bytes, return what the node echoed."""
    head = (
        "GET /v1/stream HTTP/1.1\r\nHost: cadenza\r\nConnection: Upgrade\r\n"
        "Upgrade: websocket\r\nSec-WebSocket-Version: 13\r\n"
        "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n"
    )
    with socket.create_connection(("127.0.0.1", front.port), timeout=10) as sock:
        sock.sendall(head.encode())
        response = b""
        while b"\r\n\r\n" not in response:
            response += sock.recv(4096)
        assert response.startswith(b"HTTP/1.1 101"), response
        sock.sendall(b"frame")
        return sock.recv(4096)


def test_a_websocket_upgrade_becomes_a_tunnel_to_one_node(front):
    assert _websocket_echo(front) in (b"a frame", b"b frame")


def test_a_refused_websocket_upgrade_is_retried_on_the_other_node(front):
    """A node that drains or has no ready engine refuses the upgrade itself with 503: HAProxy
    tries the other node, and the client gets its tunnel (both nodes refuse once here)."""
    for node in front.nodes.values():
        node.refuse_next(1)
    assert _websocket_echo(front) in (b"a frame", b"b frame")
    assert sum(len(node.refused) for node in front.nodes.values()) == 2


def test_admin_routes_are_refused_at_the_door(front):
    for path in ("/admin/drain", "/%61dmin/drain", "/admin/restart?model=x"):
        status, _, _ = front.request("POST", path)
        assert status == 403, path
    assert not any(node.served or node.refused for node in front.nodes.values())


def test_the_stats_page_lists_the_nodes_with_their_agents_weights(front):
    connection = http.client.HTTPConnection("127.0.0.1", front.stats_port, timeout=10)
    connection.request("GET", "/;csv")
    header, *lines = connection.getresponse().read().decode().splitlines()
    connection.close()
    columns = header.removeprefix("# ").split(",")
    rows = [dict(zip(columns, line.split(","), strict=False)) for line in lines]
    nodes = {row["svname"]: row for row in rows if row["pxname"] == "cadenza_nodes"}
    assert sorted(nodes) == ["BACKEND", "node1", "node2"]
    # "up 50%" of the declared weight 100 (at HAProxy's default weight 1 it would be 0)
    assert [nodes[name]["weight"] for name in ("node1", "node2")] == ["50", "50"]
