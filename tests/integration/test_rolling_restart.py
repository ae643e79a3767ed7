"""A rolling restart behind the front door: two real nodes behind a real HAProxy, light steady
load through the door, and each node in turn stopped with SIGTERM (it drains: its agent says
``drain``, a stream sent to it meanwhile is refused with 503 and HAProxy resends it to the
other node, its open streams finish) and started again on the same ports. No client request
fails, and both nodes serve again afterwards."""

from __future__ import annotations

import threading
import time
from collections import Counter
from pathlib import Path

import httpx
import pytest

from cadenza.cluster.haproxy_config import FrontDoor, render_haproxy_config
from cadenza.cluster.node_address import parse_address, parse_node
from tests.integration.server import RunningServer
from tests.support.haproxy_process import running_haproxy
from tests.support.ports import free_port

pytestmark = pytest.mark.timeout(300)

DETERMINISTIC = {"CADENZA_CALIBRATION__MODE": "off", "CADENZA_ADMISSION__SLACK_CLOSE_MS": "-1e9"}
SHORT = {"model": "cadenza-tiny", "input": "x" * 14, "response_format": "pcm"}  # 1 s of audio
CLIENTS = 2


class SteadyLoad:
    """``CLIENTS`` clients, each sending one stream after another through ``url`` and reading
    it to its end, until stopped; every answer's status (or the error) and node recorded."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.outcomes: list[tuple[float, str, str | None]] = []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._client) for _ in range(CLIENTS)]

    def __enter__(self) -> SteadyLoad:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(120)

    def _client(self) -> None:
        with httpx.Client(timeout=60) as http:
            while not self._stop.is_set():
                try:
                    with http.stream("POST", f"{self.url}/v1/audio/speech", json=SHORT) as r:
                        size = sum(len(chunk) for chunk in r.iter_bytes())
                        complete = r.status_code == 200 and size == 2 * 24000
                        outcome = "ok" if complete else f"{r.status_code}, {size} bytes"
                        node = r.headers.get("x-cadenza-node")
                except httpx.HTTPError as exc:
                    outcome, node = f"{type(exc).__name__}: {exc}", None
                self.outcomes.append((time.monotonic(), outcome, node))

    def served_by_since(self, since: float) -> set[str | None]:
        return {node for at, outcome, node in self.outcomes if at > since and outcome == "ok"}


def _start(name: str, port: int, agent_port: int, directory: Path, run: int) -> RunningServer:
    node = RunningServer(
        directory / f"node-{name}-{run}.log",
        DETERMINISTIC,
        args=("--node-id", name, "--agent-port", str(agent_port)),
        port=port,
    )
    node.wait_ready()
    return node


def _wait_until(condition, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.2)


def test_a_rolling_restart_under_load_fails_no_request(tmp_path) -> None:
    ports = {name: (free_port(), free_port()) for name in ("a", "b")}
    nodes = {name: _start(name, *ports[name], tmp_path, 0) for name in ports}
    door_port = free_port()
    door = FrontDoor(
        listen=parse_address(f"127.0.0.1:{door_port}", "--listen"),
        nodes=tuple(parse_node(f"127.0.0.1:{http}:{agent}") for http, agent in ports.values()),
    )
    try:
        with (
            running_haproxy(render_haproxy_config(door), tmp_path, [door_port]),
            SteadyLoad(f"http://127.0.0.1:{door_port}") as load,
        ):
            _wait_until(
                lambda: load.served_by_since(0) == {"a", "b"}, 30, "the door reached both nodes"
            )
            for name in ("a", "b"):
                nodes[name].stop()  # SIGTERM: drain, then exit
                nodes[name] = _start(name, *ports[name], tmp_path, 1)
                back = time.monotonic()
                _wait_until(
                    lambda name=name, back=back: name in load.served_by_since(back),
                    30,
                    f"node {name} took no stream after its restart",
                )
        failures = Counter(outcome for _, outcome, _ in load.outcomes if outcome != "ok")
        assert not failures, failures
        assert len(load.outcomes) > 20
    finally:
        for node in nodes.values():
            node.stop()
