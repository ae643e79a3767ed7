"""Streams through the loss of whole nodes: two nodes with stream checkpoints in Redis behind
HAProxy, WebSocket load through the front door at ``--streams`` closed-loop listeners for
``--duration`` seconds, and every ``--kill-every A-B`` seconds a random node SIGKILLed (its
process group: edge and engines, as a lost machine loses them) and started again at once on
the same ports.

Reports the share of WebSocket streams that played to their end (a stream that broke after its
audio started counts against it), how many of them resumed on another node, and for those the
gap heard (the longest underrun, after what the client had buffered) and the silence on the
wire (from the lost connection to the next audio), p50, p99 and max. Before it, a minute of
the same load without kills (``calm``), for comparison.

    .venv/bin/python benchmarks/node_loss_chaos.py --out /tmp/node-chaos --streams 19 --duration 240

Writes ``summary.json`` and the load test's report under ``--out``. Needs ``haproxy``,
``redis-server`` and ``taskset`` (``make infra``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

from cluster_vs_node import Node, free_port, front_door

from cadenza.loadtest.harness import run_loadtest
from cadenza.loadtest.level_summary import percentile
from cadenza.loadtest.workload import LoadOptions, TextLengths


class Killer(threading.Thread):
    """Kills a random node every A-B seconds and starts it again on its ports."""

    def __init__(self, nodes: list[Node], make: Any, low_s: float, high_s: float) -> None:
        super().__init__(daemon=True)
        self.nodes, self.make, self.low_s, self.high_s = nodes, make, low_s, high_s
        self.stop = threading.Event()
        self.kills: list[dict[str, Any]] = []
        self.rng = random.Random(0)

    def run(self) -> None:
        started = time.monotonic()
        while not self.stop.wait(self.rng.uniform(self.low_s, self.high_s)):
            index = self.rng.randrange(len(self.nodes))
            node = self.nodes[index]
            at = time.monotonic() - started
            os.killpg(node.process.pid, signal.SIGKILL)
            node.process.wait()
            node.log.close()
            fresh = self.make(node)
            fresh.wait_ready()
            self.nodes[index] = fresh
            self.kills.append(
                {"at_s": round(at, 1), "node": node.name, "back_after_s": round(
                    time.monotonic() - started - at, 1
                )}
            )  # fmt: skip


def level_numbers(report: dict[str, Any]) -> dict[str, Any]:
    level = report["levels"][0]
    streams = level["streams"]
    admitted = [s for s in streams if s["outcome"] in ("served", "queued_served")]
    broken = [s for s in streams if s.get("broken")]
    resumed = [s for s in admitted if s.get("resumed")]
    gaps = [float(s["longest_underrun_ms"] or 0.0) for s in resumed]
    silences = [float(s["resume_gap_ms"]) for s in resumed if s.get("resume_gap_ms") is not None]
    started = len(admitted) + len(broken)
    return {
        "offered": len(streams),
        "started": started,
        "completed": len(admitted),
        "completed_share": round(len(admitted) / started, 5) if started else None,
        "errors_by_reason": level.get("errors_by_reason"),
        "refused_by_reason": level.get("rejected_by_reason"),
        "resumed": len(resumed),
        "resumed_gap_ms": {  # what the listener heard: its longest underrun
            "p50": percentile(gaps, 50),
            "p99": percentile(gaps, 99),
            "max": max(gaps, default=None),
        },
        "resumed_silence_ms": {  # from the connection's loss to the next audio to arrive
            "p50": percentile(silences, 50),
            "p99": percentile(silences, 99),
            "max": max(silences, default=None),
        },
        "c100": level.get("c100"),
        "ttfa_ms": level.get("ttfa_ms"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--streams", type=int, required=True, help="closed-loop listeners")
    parser.add_argument("--duration", type=float, default=240.0)
    parser.add_argument("--kill-every", default="30-60", help="A-B seconds between kills")
    parser.add_argument("--skip-calm", action="store_true", help="no run without kills")
    args = parser.parse_args()
    for tool in ("haproxy", "redis-server", "taskset"):
        if shutil.which(tool) is None:
            sys.exit(f"needs {tool} (make infra)")
    low_s, high_s = (float(x) for x in args.kill_every.split("-"))
    args.out.mkdir(parents=True, exist_ok=True)
    cores = sorted(os.sched_getaffinity(0))
    halves = [
        ",".join(map(str, cores[: len(cores) // 2])),
        ",".join(map(str, cores[len(cores) // 2 :])),
    ]
    redis_port = free_port()
    redis = subprocess.Popen(
        ["redis-server", "--port", str(redis_port), "--bind", "127.0.0.1", "--save", "",
         "--appendonly", "no"],
        stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
    )  # fmt: skip
    env = {
        "CADENZA_LIMITS__REDIS_URL": f"redis://127.0.0.1:{redis_port}/0",
        "CADENZA_AUTH__TOKEN_SECRET": secrets.token_urlsafe(48),  # the same on both nodes
    }
    load = LoadOptions(
        url="http://127.0.0.1:1",
        duration_s=args.duration,
        transport="ws",
        text_lengths=TextLengths(40, 120),
    )
    summary: dict[str, Any] = {"streams": args.streams, "kill_every_s": args.kill_every}
    with tempfile.TemporaryDirectory(prefix="cadenza-node-chaos-") as scratch:
        cache = Path(scratch) / "cache"

        def make(old: Node) -> Node:
            return Node(
                old.name, args.out, cache, 1, cores=old_cores[old.name],
                agent_port=old.agent_port, port=old.port, env=env,
            )  # fmt: skip

        old_cores = dict(zip(("a", "b"), halves, strict=True))
        nodes = [
            Node(name, args.out, cache, 1, cores=half, agent_port=free_port(), env=env)
            for name, half in old_cores.items()
        ]
        try:
            for node in nodes:
                node.wait_ready()
            with front_door(nodes, args.out, "leastconn") as url:
                if not args.skip_calm:
                    calm, _ = asyncio.run(
                        run_loadtest(
                            replace(load, url=url, duration_s=min(args.duration, 60.0)),
                            out_dir=args.out / "calm",
                            concurrency=args.streams,
                        )
                    )
                    summary["calm"] = level_numbers(calm)
                killer = Killer(nodes, make, low_s, high_s)
                killer.start()
                report, _ = asyncio.run(
                    run_loadtest(
                        replace(load, url=url), out_dir=args.out / "chaos", concurrency=args.streams
                    )
                )
                killer.stop.set()
                killer.join(120)
                summary["chaos"] = level_numbers(report)
                summary["kills"] = killer.kills
        finally:
            for node in nodes:
                node.stop()
            redis.terminate()
            redis.wait()
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2))
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
