"""Two nodes behind HAProxy against one node served directly, on the same machine, in one run.

* ``node``: one ``cadenza serve --replicas 2`` (the machine's cores divided between its two
  engine replicas), swept directly.
* ``cluster``: two ``cadenza serve --replicas 1`` nodes, each pinned to half of the cores
  (``taskset``: its edge and its engine), with ``--agent-port``, behind HAProxy configured by
  ``cadenza haproxy-config``, swept through HAProxy once per ``--balance`` algorithm.

Both sweeps use the same load (``cadenza loadtest --sweep``'s closed loop over the SDK) and
report capacity at SLO; the ratio cluster / node is the cost of running as a fleet. Then the
front door's added latency: light levels (``--ttfa-streams`` listeners for ``--ttfa-seconds``)
alternating straight to node ``a`` and through HAProxy, ``--ttfa-rounds`` times each; the
medians of each side's TTFA p50 and their difference.

    .venv/bin/python benchmarks/cluster_vs_node.py --out /tmp/cluster --duration 20

Writes ``summary.json`` and each sweep's report under ``--out``. Needs ``haproxy`` and
``taskset`` (``make infra`` installs HAProxy).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx

from cadenza.loadtest.harness import run_loadtest
from cadenza.loadtest.workload import LoadOptions, TextLengths


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Node:
    """``cadenza serve`` on a free port (pinned to ``cores`` when given)."""

    def __init__(
        self,
        name: str,
        out: Path,
        cache: Path,
        replicas: int,
        cores: str | None = None,
        agent_port: int | None = None,
        port: int | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        self.name = name
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.agent_port = agent_port
        command = [sys.executable, "-m", "cadenza", "serve", "--port", str(self.port)]
        command += ["--replicas", str(replicas), "--node-id", name]
        if agent_port is not None:
            command += ["--agent-port", str(agent_port)]
        if cores is not None:
            command = ["taskset", "-c", cores, *command]
        env = {**os.environ, "CADENZA_CALIBRATION__CACHE_DIR": str(cache), **(env or {})}
        self.log = (out / f"{name}.log").open("ab")
        self.process = subprocess.Popen(
            command, stdout=self.log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )

    def wait_ready(self, timeout_s: float = 600.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"node {self.name} exited; see its log")
            try:
                if httpx.get(f"{self.url}/readyz", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise RuntimeError(f"node {self.name} not ready in {timeout_s} s")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, 9)
                self.process.wait()
        self.log.close()


@contextmanager
def front_door(nodes: list[Node], out: Path, balance: str) -> Iterator[str]:
    """HAProxy in front of ``nodes``, configured by ``cadenza haproxy-config``; its URL."""
    port = free_port()
    command = [sys.executable, "-m", "cadenza", "haproxy-config", "--listen", f"127.0.0.1:{port}"]
    for node in nodes:
        command += ["--node", f"127.0.0.1:{node.port}:{node.agent_port}"]
    command += ["--balance", balance]
    config = out / f"haproxy-{balance}.cfg"
    config.write_text(subprocess.run(command, check=True, capture_output=True, text=True).stdout)
    log = (out / f"haproxy-{balance}.log").open("wb")
    haproxy = subprocess.Popen(
        ["haproxy", "-db", "-f", str(config)], stdout=log, stderr=subprocess.STDOUT
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(f"{url}/readyz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if haproxy.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"haproxy did not come up; see {log.name}")
            time.sleep(0.2)
        time.sleep(3)  # a few agent checks: the weights are the nodes' own
        yield url
    finally:
        haproxy.terminate()
        haproxy.wait(timeout=10)
        log.close()


def sweep(options: LoadOptions, out: Path, start: int, limit: int) -> dict[str, Any]:
    report, _ = asyncio.run(
        run_loadtest(options, out_dir=out, concurrency=None, start=start, limit=limit)
    )
    return report


def ttfa_p50(options: LoadOptions, out: Path, streams: int) -> float:
    report, _ = asyncio.run(run_loadtest(options, out_dir=out, concurrency=streams))
    return float(report["levels"][0]["ttfa_ms"]["p50"])


def cluster_summary(report: dict[str, Any]) -> dict[str, Any]:
    """A cluster sweep's capacity and, per level, the streams each node admitted."""
    return {
        "capacity": report["capacity_streams"],
        "spread": {
            str(level["concurrency"]): level.get("admitted_by_node") for level in report["levels"]
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--duration", type=float, default=20.0, help="seconds per sweep level")
    parser.add_argument("--start", type=int, default=8, help="sweeps: first level")
    parser.add_argument("--limit", type=int, default=64, help="sweeps: largest level")
    parser.add_argument(
        "--balance",
        nargs="+",
        default=["leastconn"],
        choices=["leastconn", "roundrobin"],
        help="the cluster is swept once per algorithm, the same nodes behind a fresh HAProxy; "
        "the first is the one compared with the node and timed for TTFA",
    )
    parser.add_argument("--skip-node", action="store_true", help="sweep the cluster only")
    parser.add_argument("--ttfa-streams", type=int, default=2)
    parser.add_argument("--ttfa-seconds", type=float, default=20.0)
    parser.add_argument("--ttfa-rounds", type=int, default=3)
    args = parser.parse_args()
    if shutil.which("haproxy") is None or shutil.which("taskset") is None:
        sys.exit("needs haproxy (make infra) and taskset")
    cores = sorted(os.sched_getaffinity(0))
    halves = (
        ",".join(map(str, cores[: len(cores) // 2])),
        ",".join(map(str, cores[len(cores) // 2 :])),
    )
    args.out.mkdir(parents=True, exist_ok=True)
    load = LoadOptions(
        url="http://127.0.0.1:1", duration_s=args.duration, text_lengths=TextLengths(40, 120)
    )
    summary: dict[str, Any] = {"cores": len(cores), "balances": {}}
    with tempfile.TemporaryDirectory(prefix="cadenza-cluster-") as scratch:
        if not args.skip_node:
            node = Node("node", args.out, Path(scratch) / "node-cache", replicas=2)
            try:
                node.wait_ready()
                report = sweep(
                    replace(load, url=node.url), args.out / "node", args.start, args.limit
                )
                summary["node_capacity"] = report["capacity_streams"]
            finally:
                node.stop()
        cache = Path(scratch) / "cluster-cache"
        nodes = [
            Node(name, args.out, cache, 1, cores=half, agent_port=free_port())
            for name, half in zip(("a", "b"), halves, strict=True)
        ]
        try:
            for member in nodes:
                member.wait_ready()
            for balance in args.balance[1:]:  # the others first: the first keeps its HAProxy
                with front_door(nodes, args.out, balance) as url:
                    report = sweep(
                        replace(load, url=url),
                        args.out / f"cluster-{balance}",
                        args.start,
                        args.limit,
                    )
                    summary["balances"][balance] = cluster_summary(report)
            with front_door(nodes, args.out, args.balance[0]) as url:
                report = sweep(replace(load, url=url), args.out / "cluster", args.start, args.limit)
                summary["balances"][args.balance[0]] = cluster_summary(report)
                summary["cluster_capacity"] = report["capacity_streams"]
                light = replace(load, duration_s=args.ttfa_seconds)
                direct, through = [], []
                for round_ in range(args.ttfa_rounds):
                    direct.append(
                        ttfa_p50(
                            replace(light, url=nodes[0].url),
                            args.out / f"ttfa-direct-{round_}",
                            args.ttfa_streams,
                        )
                    )
                    through.append(
                        ttfa_p50(
                            replace(light, url=url),
                            args.out / f"ttfa-haproxy-{round_}",
                            args.ttfa_streams,
                        )
                    )
                summary["ttfa_p50_ms"] = {
                    "direct": direct,
                    "haproxy": through,
                    "median_difference": round(
                        statistics.median(through) - statistics.median(direct), 1
                    ),
                }
        finally:
            for member in nodes:
                member.stop()
    node_capacity = summary.get("node_capacity") or 0
    summary["cluster_over_node"] = (
        round(summary["cluster_capacity"] / node_capacity, 3) if node_capacity else None
    )
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2))
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
