"""Start the real server (``python -m cadenza serve``) on a free port for a test module."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from tests.support.ports import free_port


def without_node_label(sample: str) -> str:
    """A Prometheus sample line without the ``node`` label every sample of a node carries."""
    sample = re.sub(r'([{,])node="[^"]*"', r"\1", sample)
    return sample.replace("{,", "{").replace(",}", "}").replace("{}", "")


class RunningServer:
    """``cadenza serve`` on ``port`` (a free one by default), on the CPU. ``replicas``: engine
    replicas per model (``None``: the server's default, which on a small CPU is one per core);
    tests run one unless they say otherwise, so that slots and engine processes are what they
    count. Each server registers alone on the host (a registry of its own), so that the
    servers a test runs side by side, and any other node on the machine, do not divide its
    cores, unless the test names a registry for them to share
    (``CADENZA_SUPERVISION__HOST_REGISTRY_DIR``, tests/integration/test_nodes_on_one_host.py)."""

    def __init__(
        self,
        log_path: Path,
        env: dict[str, str] | None = None,
        args: tuple[str, ...] = (),
        replicas: int | None = 1,
        port: int | None = None,
        own_group: bool = False,
    ) -> None:
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        self.idle_tasks = float("inf")  # edge asyncio tasks when idle, once a test records it
        self._log = log_path.open("wb")
        alone = {
            "CADENZA_SUPERVISION__HOST_REGISTRY_DIR": str(log_path.parent / f"host-{self.port}")
        }
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "cadenza",
                "serve",
                "--port",
                str(self.port),
                "--device",
                "cpu",
                *args,
            ],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **alone, **_replicas_env(replicas), **(env or {})},
            start_new_session=own_group,  # a process group of its own: the node, to kill whole
        )

    def wait_ready(self, timeout_s: float = 120.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"server exited early:\n{self.log_path.read_text()}")
            try:
                if httpx.get(f"{self.url}/readyz", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"server not ready in {timeout_s} s:\n{self.log_path.read_text()}")

    def engine_pids(self) -> list[int]:
        """Engine processes among the server's children (any other child, such as a helper
        a library starts for a moment, is not one)."""
        pids = []
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
                if int(fields[1]) != self.process.pid:
                    continue
                command = (stat.parent / "cmdline").read_bytes()
            except OSError:
                continue
            if b"cadenza.ipc.engine_side" in command:
                pids.append(int(stat.parent.name))
        return pids

    def metric(self, name: str) -> float:
        """Sum of the Prometheus samples whose line starts with ``name`` (labels included), the
        node's own label (on every sample) left out."""
        text = httpx.get(f"{self.url}/metrics", timeout=10).text
        lines = (without_node_label(line) for line in text.splitlines())
        return sum(
            float(line.rsplit(" ", 1)[1])
            for line in lines
            if line.startswith(name) and not line.startswith("#")
        )

    def kill_group(self) -> None:
        """SIGKILL the node whole, edge and engines (started with ``own_group``)."""
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self._log.close()


def _replicas_env(replicas: int | None) -> dict[str, str]:
    return {} if replicas is None else {"CADENZA_SUPERVISION__REPLICAS": str(replicas)}


@contextmanager
def serving(
    log_path: Path,
    env: dict[str, str] | None = None,
    *,
    calibrated: bool = False,
    args: tuple[str, ...] = (),
    replicas: int | None = 1,
) -> Iterator[RunningServer]:
    """A ready server for the duration of the block (the body of a module fixture).

    Without ``calibrated`` the server admits by KV memory and ``max_num_seqs`` only (no step
    time model, and late chunks do not close admission): tests of what a transport does must
    not depend on how many real-time streams this machine holds.
    """
    if not calibrated:
        deterministic = {
            "CADENZA_CALIBRATION__MODE": "off",
            "CADENZA_ADMISSION__SLACK_CLOSE_MS": "-1e9",
        }
        env = {**deterministic, **(env or {})}
    running = RunningServer(log_path, env, args, replicas)
    try:
        running.wait_ready()
        yield running
    finally:
        running.stop()


def wait_until_idle(server: RunningServer, timeout_s: float = 10.0) -> None:
    """Wait until the server has no stream and no engine request left (what a test checks
    after each fault scenario); fails the test when something stays behind."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        time.sleep(0.6)  # engine stats arrive every 0.5 s
        if (
            server.metric("cadenza_engine_requests") == 0
            and server.metric("cadenza_streams_active") == 0
        ):
            return
    pytest.fail("streams or engine requests were left behind")
