"""Two cadenza nodes sharing a Redis, for tests of what a fleet does when a node is lost:
each node in a process group of its own (SIGKILL takes edge and engines), restartable on the
same ports so that the front door finds it again."""

from __future__ import annotations

import contextlib
import time
from pathlib import Path

import httpx

from cadenza.cluster.haproxy_config import FrontDoor
from cadenza.cluster.node_address import parse_address, parse_node
from tests.integration.server import RunningServer
from tests.support.ports import free_port

DETERMINISTIC = {
    "CADENZA_CALIBRATION__MODE": "off",
    "CADENZA_ADMISSION__SLACK_CLOSE_MS": "-1e9",
    # A resumed stream's codec state is rebuilt from other chunks than the first time: in
    # float32 that is the same audio to a step of 16-bit PCM; a bf16 codec (the default where
    # the CPU has AMX) rounds more coarsely (docs/protocol.md, "Resuming a stream").
    "CADENZA_CPU__CODEC_DTYPE": "float32",
}
TOKEN_SECRET = "the fleet's token secret: every node the same"  # seals checkpoints (32+ chars)


class Fleet:
    """Nodes ``a`` and ``b``, sharing the Redis at ``redis_url`` and :data:`TOKEN_SECRET`
    (stream checkpoints), each in its own process group and restartable on its ports;
    :meth:`door` is the front door's configuration for them."""

    def __init__(self, directory: Path, redis_url: str) -> None:
        self.directory = directory
        self.env = {
            **DETERMINISTIC,
            "CADENZA_LIMITS__REDIS_URL": redis_url,
            "CADENZA_AUTH__TOKEN_SECRET": TOKEN_SECRET,
        }
        self.ports = {name: (free_port(), free_port()) for name in ("a", "b")}
        self.nodes: dict[str, RunningServer] = {}
        self.runs = 0
        self.door_url = ""  # set by door()
        for name in self.ports:
            self.start(name)

    def restart(self, name: str, timeout_s: float = 30.0) -> None:
        """Start node ``name`` again, and wait until the front door sends requests to it."""
        self.start(name)
        deadline = time.monotonic() + timeout_s
        while True:
            seen = set()
            for _ in range(6):
                with contextlib.suppress(httpx.HTTPError):
                    answer = httpx.get(f"{self.door_url}/v1/models", timeout=5)
                    seen.add(answer.headers.get("x-cadenza-node"))
            if name in seen:
                return
            assert time.monotonic() < deadline, f"the front door does not reach node {name}"
            time.sleep(0.5)

    def start(self, name: str) -> None:
        """Start node ``name`` (again) and wait until it is ready."""
        http, agent = self.ports[name]
        self.runs += 1
        node = RunningServer(
            self.directory / f"node-{name}-{self.runs}.log",
            self.env,
            args=("--node-id", name, "--agent-port", str(agent)),
            port=http,
            own_group=True,
        )
        node.wait_ready()
        self.nodes[name] = node

    def door(self, port: int) -> FrontDoor:
        """HAProxy listening on ``port`` in front of both nodes."""
        self.door_url = f"http://127.0.0.1:{port}"
        return FrontDoor(
            listen=parse_address(f"127.0.0.1:{port}", "--listen"),
            nodes=tuple(parse_node(f"127.0.0.1:{h}:{a}") for h, a in self.ports.values()),
        )

    def stop(self) -> None:
        for node in self.nodes.values():
            node.stop()
