"""What a storm of simultaneous arrivals costs the edge's admission: the event loop time the
gate takes to weigh ``--arrivals`` requests that come in one instant (each placed or queued
once, the queue dispatched after each), against the calibration this machine measured for
cadenza-tiny (the newest file in the calibration cache) with ``--replicas`` replicas.

Every millisecond here is a millisecond the edge's loop relays no audio: at three times the
claim, the first wave's second chunks are due while the rest of the wave is still being
weighed (docs/capacity.md, "Arrival waves"). The median of ``--repeats`` storms, each on a
fresh gate::

    .venv/bin/python benchmarks/admission_storm.py --arrivals 108 --replicas 2
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import time
from dataclasses import replace

from cadenza.config import AdmissionConfig
from cadenza.edge.admission.capacity import CapacityModel
from cadenza.edge.admission.gate import AdmissionGate
from cadenza.edge.admission.ticket import AdmissionRefused
from cadenza.edge.server.metrics import Metrics
from cadenza.edge.server.model_metrics import ModelMetrics
from cadenza.engine.engine import Engine
from cadenza.engine.realtime.calibration_cache import cache_path, read_cache


async def storm(gate: AdmissionGate, capacity: CapacityModel, arrivals: int) -> float:
    """Seconds of loop time until every one of ``arrivals`` simultaneous requests has been
    admitted, queued or refused once."""

    async def on_queued(position: int, wait_s: float) -> None:
        return None

    async def one(index: int) -> None:
        characters = 40 + index % 80  # the load tester's default text lengths
        cost = capacity.stream_cost("x" * characters, characters / 14.0)
        with contextlib.suppress(AdmissionRefused):  # refused at once: weighed all the same
            await gate.acquire("standard", cost, on_queued)

    started = time.perf_counter()
    tasks = [asyncio.create_task(one(i)) for i in range(arrivals)]
    for _ in range(4):  # each task runs to its first wait (or its end)
        await asyncio.sleep(0)
    elapsed = time.perf_counter() - started
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arrivals", type=int, default=108)
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    engine = Engine.from_pretrained("cadenza-tiny")
    cached = cache_path(engine, "any").parent.glob("calibration-*.json")
    newest = max(cached, key=lambda p: p.stat().st_mtime, default=None)
    calibration = None if newest is None else read_cache(newest, 1.0)
    if newest is None or calibration is None:
        raise SystemExit("no calibration this version reads: start `cadenza serve` once first")
    info = replace(engine.info, calibration=calibration)
    config = AdmissionConfig()
    seconds = []
    for _ in range(args.repeats):
        capacity = CapacityModel(info, config)
        gate = AdmissionGate(config, capacity, ModelMetrics(Metrics(), "cadenza-tiny"))
        for index in range(1, args.replicas):
            gate.set_replica(index, CapacityModel(info, config))
        seconds.append(asyncio.run(storm(gate, capacity, args.arrivals)))
    print(
        f"{args.arrivals} arrivals at once, {args.replicas} replicas "
        f"(claim {gate.max_streams()}, calibration {newest.name}): "
        f"median {1000 * statistics.median(seconds):.1f} ms of loop time "
        f"({1000 * min(seconds):.1f}-{1000 * max(seconds):.1f})"
    )


if __name__ == "__main__":
    main()
