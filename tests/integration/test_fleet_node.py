"""A node as the front door sees it: its name on every response, greeting and metric, and its
HAProxy agent check: ``down`` while loading, ``up N%`` by its free headroom (honouring
``admission.max_streams``), ``drain`` once it drains."""

from __future__ import annotations

import asyncio
import json
import socket
import time

import httpx
import websockets

from tests.integration.server import RunningServer, free_port

DETERMINISTIC = {"CADENZA_CALIBRATION__MODE": "off", "CADENZA_ADMISSION__SLACK_CLOSE_MS": "-1e9"}


def ask_agent(port: int) -> str | None:
    """The agent's line, or ``None`` while nothing listens on ``port``."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
            return sock.makefile("rb").readline().decode().strip()
    except ConnectionRefusedError:
        return None


def test_a_node_names_itself_and_tells_haproxy_its_headroom(tmp_path) -> None:
    agent_port = free_port()
    server = RunningServer(
        tmp_path / "server.log",
        {**DETERMINISTIC, "CADENZA_ADMISSION__MAX_STREAMS": "4"},
        args=("--node-id", "node-a", "--agent-port", str(agent_port)),
    )
    try:
        lines = []
        deadline = time.monotonic() + 60
        while (line := ask_agent(agent_port)) is None or line == "down":
            assert server.process.poll() is None and time.monotonic() < deadline
            if line is not None:
                lines.append(line)
            time.sleep(0.05)
        assert lines and set(lines) == {"down"}, "the agent says down while the model loads"
        server.wait_ready()
        assert ask_agent(agent_port) == "up ready 100%"

        ready = httpx.get(f"{server.url}/readyz", timeout=10)
        assert ready.headers["x-cadenza-node"] == "node-a"
        capacity = httpx.get(f"{server.url}/v1/capacity", timeout=10).json()
        assert capacity["max_streams"] <= 4 and capacity["limits"]["operator"] == 4
        metrics = httpx.get(f"{server.url}/metrics", timeout=10).text
        assert 'cadenza_streams_admitted{model="cadenza-tiny",node="node-a"}' in metrics

        async def greeting_and_one_stream() -> tuple[dict, list[str]]:
            seen = []
            async with websockets.connect(f"ws://127.0.0.1:{server.port}/v1/stream") as ws:
                ready = json.loads(await ws.recv())
                await ws.send(json.dumps({"type": "speak", "text": "x" * 40}))
                while True:
                    message = await ws.recv()
                    if isinstance(message, bytes):
                        seen.append(await asyncio.to_thread(ask_agent, agent_port))
                        if len(seen) == 2:
                            httpx.post(f"{server.url}/admin/drain", timeout=10)
                        if len(seen) == 4:
                            break
                return ready, seen

        ready_message, seen = asyncio.run(greeting_and_one_stream())
        assert ready_message["node"] == "node-a"
        assert seen[0] == "up ready 75%"  # one stream of a cap of 4
        assert seen[-1] == "drain"
    finally:
        server.stop()
