"""What a fleet's parts cost per stream: the shared quota's round trip to a real Redis (one
admission, one give-back) and one HAProxy agent check, each timed ``--rounds`` times on
loopback; medians and 99th percentiles in microseconds.

    .venv/bin/python benchmarks/fleet_costs.py --rounds 2000

Starts its own ``redis-server`` on a free loopback port (``make infra`` installs it).
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import socket
import statistics
import subprocess
import tempfile
import time

from cadenza.edge.admission.rate_limit import RateLimiter
from cadenza.edge.admission.shared_rate_limit import SharedRateLimiter
from cadenza.edge.server.agent_check import AgentCheckServer, NodeState
from cadenza.edge.server.metrics import Metrics


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def summary(samples_s: list[float]) -> str:
    ordered = sorted(samples_s)
    p99 = ordered[max(int(len(ordered) * 0.99) - 1, 0)]
    return f"median {1e6 * statistics.median(ordered):.0f} us, p99 {1e6 * p99:.0f} us"


async def quota(url: str, rounds: int) -> tuple[list[float], list[float]]:
    limiter = SharedRateLimiter(url, RateLimiter(1e9, 1e9), Metrics())
    acquire, give_back = [], []
    for i in range(rounds):
        started = time.perf_counter()
        grant = await limiter.acquire(f"key:{i % 100}", 5.0)
        acquire.append(time.perf_counter() - started)
        started = time.perf_counter()
        await limiter._give_back(
            keys=[f"cadenza:quota:{{key:{i % 100}}}:r"] * 2, args=[1e9, 1e9, 0, 1]
        )
        give_back.append(time.perf_counter() - started)
        assert grant.shared
    await limiter.close()
    return acquire, give_back


async def agent(rounds: int) -> list[float]:
    """Wall time of a check as HAProxy sees it (the agent first waits ``INPUT_WAIT_S`` for a
    query, then answers), and the CPU time of a check, both ends in this process."""
    server = AgentCheckServer("127.0.0.1", 0, lambda: NodeState(False, True, ()))
    await server.start()
    times = []
    cpu = time.process_time()
    for _ in range(rounds):
        started = time.perf_counter()
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        await reader.read()
        writer.close()
        times.append(time.perf_counter() - started)
    cpu_us = 1e6 * (time.process_time() - cpu) / rounds
    await server.stop()
    print(f"(CPU {cpu_us:.0f} us a check, both ends) ", end="")
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2000)
    args = parser.parse_args()
    binary = shutil.which("redis-server")
    if binary is None:
        raise SystemExit("needs redis-server (make infra)")
    port = free_port()
    with tempfile.TemporaryDirectory() as scratch:
        redis = subprocess.Popen(
            [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--dir", scratch],
            stdout=subprocess.DEVNULL,
        )
        try:
            time.sleep(0.5)
            acquire, give_back = asyncio.run(quota(f"redis://127.0.0.1:{port}/0", args.rounds))
        finally:
            redis.terminate()
            redis.wait()
    print(f"quota admission (one Lua round trip): {summary(acquire)}")
    print(f"quota give-back (one Lua round trip): {summary(give_back)}")
    print(f"agent check (connect, line, close), {args.rounds // 4} rounds: ", end="")
    print(summary(asyncio.run(agent(args.rounds // 4))))


if __name__ == "__main__":
    main()
