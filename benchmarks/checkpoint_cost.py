"""What stream checkpoints cost one node: the same node swept without and with
``limits.redis_url`` (every WebSocket stream then writes its checkpoint to Redis), in one run.

``--rounds`` alternates the order (off, on; then on, off; ...) and the capacities compared are
each side's median. For each: capacity at SLO (``cadenza loadtest --sweep`` over the SDK),
then one level of ``--streams`` listeners for ``--level-seconds`` during which the edge
process's CPU time and Redis's commands are counted: edge CPU per second of audio served and
Redis commands per second (and per stream-second).

    .venv/bin/python benchmarks/checkpoint_cost.py --out /tmp/checkpoints --duration 15 --rounds 2

Writes ``summary.json`` and each sweep's report under ``--out``. Needs ``redis-server``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

from cluster_vs_node import Node, free_port

from cadenza.loadtest.harness import run_loadtest
from cadenza.loadtest.workload import LoadOptions, TextLengths


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time of process ``pid`` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def redis_commands(port: int) -> int:
    """Commands the Redis on ``port`` has processed (``INFO stats``), over plain RESP."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(b"INFO stats\r\n")
        data = b""
        while b"total_commands_processed:" not in data or not data.endswith(b"\r\n"):
            data += sock.recv(65536)
    line = next(x for x in data.decode().split("\r\n") if x.startswith("total_commands_processed"))
    return int(line.split(":")[1])


def measure(
    node: Node, load: LoadOptions, out: Path, args: argparse.Namespace, redis_port: int | None
) -> dict[str, Any]:
    report, _ = asyncio.run(
        run_loadtest(replace(load, url=node.url), out_dir=out / "sweep", concurrency=None,
                     start=args.start, limit=args.limit)
    )  # fmt: skip
    level = replace(load, url=node.url, duration_s=args.level_seconds)
    cpu_before = cpu_seconds(node.process.pid)
    commands_before = redis_commands(redis_port) if redis_port else 0
    started = time.monotonic()
    steady, _ = asyncio.run(run_loadtest(level, out_dir=out / "level", concurrency=args.streams))
    wall = time.monotonic() - started
    cpu = cpu_seconds(node.process.pid) - cpu_before
    commands = (redis_commands(redis_port) - commands_before) if redis_port else 0
    audio_s = float(steady["levels"][0].get("audio_s") or 0.0)
    return {
        "capacity": report["capacity_streams"],
        "level": {
            "streams": args.streams,
            "wall_s": round(wall, 1),
            "audio_s": round(audio_s, 1),
            "edge_cpu_s": round(cpu, 2),
            "edge_cpu_per_audio_s": round(cpu / audio_s, 4) if audio_s else None,
            "redis_commands_per_s": round(commands / wall, 1),
            "redis_commands_per_audio_s": round(commands / audio_s, 2) if audio_s else None,
            "c100": steady["levels"][0].get("c100"),
            "ttfa_ms": steady["levels"][0].get("ttfa_ms"),
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--duration", type=float, default=20.0, help="seconds per sweep level")
    parser.add_argument("--start", type=int, default=8)
    parser.add_argument("--limit", type=int, default=64)
    parser.add_argument("--streams", type=int, default=20, help="the measured level")
    parser.add_argument("--level-seconds", type=float, default=30.0)
    parser.add_argument(
        "--rounds", type=int, default=1, help="rounds of off, on (the next on, off, ...)"
    )
    args = parser.parse_args()
    if shutil.which("redis-server") is None:
        sys.exit("needs redis-server (make infra)")
    args.out.mkdir(parents=True, exist_ok=True)
    redis_port = free_port()
    redis = subprocess.Popen(
        ["redis-server", "--port", str(redis_port), "--bind", "127.0.0.1", "--save", "",
         "--appendonly", "no"],
        stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
    )  # fmt: skip
    load = LoadOptions(
        url="http://127.0.0.1:1", duration_s=args.duration, text_lengths=TextLengths(40, 120)
    )
    runs: dict[str, list[dict[str, Any]]] = {"off": [], "on": []}
    on = {
        "CADENZA_LIMITS__REDIS_URL": f"redis://127.0.0.1:{redis_port}/0",
        "CADENZA_AUTH__TOKEN_SECRET": secrets.token_urlsafe(48),  # checkpoints are sealed
    }
    envs: dict[str, dict[str, str]] = {"off": {}, "on": on}
    try:
        with tempfile.TemporaryDirectory(prefix="cadenza-checkpoints-") as scratch:
            cache = Path(scratch) / "cache"
            for round_ in range(args.rounds):
                order = ("off", "on") if round_ % 2 == 0 else ("on", "off")
                for name in order:
                    node = Node(f"checkpoints-{name}", args.out, cache, 2, env=envs[name])
                    try:
                        node.wait_ready()
                        port = redis_port if name == "on" else None
                        out = args.out / f"{name}-{round_}"
                        runs[name].append(measure(node, load, out, args, port))
                    finally:
                        node.stop()
    finally:
        redis.terminate()
        redis.wait()
    summary: dict[str, Any] = {"rounds": runs}
    capacities = {name: [run["capacity"] for run in runs[name]] for name in runs}
    summary["capacities"] = capacities
    off, on = statistics.median(capacities["off"]), statistics.median(capacities["on"])
    summary["capacity_on_over_off"] = round(on / off, 3) if off else None
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2))
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
