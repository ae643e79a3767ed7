"""KV pages in runs against pages from the free queue, one engine under churn, in process.

    .venv/bin/python benchmarks/kv_runs_ab.py --streams 10 --phase-s 20 --rounds 3

cadenza-tiny on one thread (pinned to CPU 0 where the OS allows), its calibration applied;
``--streams`` requests of the load tester's default texts run in real time, a new one as soon
as one ends (as ``churn_in_process.py``). The free queue starts shuffled, as it is on a server
that has run for a while (a fresh pool hands pages out in address order). Phases alternate
between the pool's placement (each sequence's own pages a run of neighbours) and the free
queue's order (least recently freed first, what every sequence got before runs); the first
``--settle-s`` of each phase, while the streams placed by the other policy finish, are left
out. Prints, per phase, the mean decode step outside the codec against the calibrated model,
the mean time of the fused backbone call, and how many of the running sequences' page
neighbours (page ``i + 1`` of a table after page ``i``) sit next to each other in the cache.
"""

from __future__ import annotations

import argparse
import itertools
import os
import random
import statistics
import time
from typing import Any

import torch

from cadenza.config import EngineConfig
from cadenza.contract.request import SynthesisRequest
from cadenza.contract.sampling import SamplingParams
from cadenza.engine.engine import Engine
from cadenza.engine.kv.page_pool import PagePool
from cadenza.engine.realtime.calibration import load_or_calibrate
from cadenza.loadtest.workload import TextLengths

TEXTS = TextLengths(40, 120)  # the load tester's default utterances


class Placement:
    """Switches a pool between runs and the free queue's order."""

    def __init__(self, pool: PagePool) -> None:
        self.pool = pool
        self.runs = PagePool.allocate_run.__get__(pool)
        self.extend = PagePool.extend_run.__get__(pool)

    def use_runs(self, on: bool) -> None:
        pool: Any = self.pool
        if on:
            pool.allocate_run, pool.extend_run = self.runs, self.extend
        else:
            pool.allocate_run = lambda count, span: pool.allocate(count)
            pool.extend_run = lambda last, count, span: pool.allocate(count)


class TimedCalls:
    """Wraps a callable attribute to record each call's seconds."""

    def __init__(self, owner: Any, name: str) -> None:
        self.seconds: list[float] = []
        self._call = getattr(owner, name)
        setattr(owner, name, self)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._call, name)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        out = self._call(*args, **kwargs)
        self.seconds.append(time.perf_counter() - started)
        return out


def adjacency(tables: list[list[int]]) -> float:
    """Share of neighbouring table entries that are neighbouring pages."""
    pairs = [(a, b) for table in tables for a, b in itertools.pairwise(table)]
    return sum(b == a + 1 for a, b in pairs) / len(pairs) if pairs else 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", type=int, default=10)
    parser.add_argument("--phase-s", type=float, default=20.0)
    parser.add_argument("--settle-s", type=float, default=8.0)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.set_grad_enabled(False)
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {0})
    engine = Engine.from_pretrained(
        "cadenza-tiny", engine_config=EngineConfig(kv_cache_memory_bytes=512 << 20)
    )
    calibration = load_or_calibrate(engine)
    engine.apply_calibration(calibration)
    assert calibration is not None
    model = calibration.model
    pool = engine.scheduler.kv.pool
    order = list(pool._free)
    random.Random(0).shuffle(order)
    pool._free.clear()
    pool._free.update(dict.fromkeys(order))
    placement = Placement(pool)
    backbone: Any = engine.model.backbone
    fused = TimedCalls(backbone, "fused_decode")
    rng = random.Random(1)
    started = 0

    def start() -> None:
        nonlocal started
        text = TEXTS.sample(rng)
        request = SynthesisRequest(
            f"r{started}", text, max_duration_s=30, sampling=SamplingParams(seed=started)
        )
        engine.add_request(request)
        started += 1

    for _ in range(args.streams):
        start()
    results: dict[str, list[tuple[float, float, float, float]]] = {"queue": [], "runs": []}
    for _ in range(args.rounds):
        for name in ("queue", "runs"):
            placement.use_runs(name == "runs")
            begin = time.monotonic()
            engine.telemetry.take_report()
            fused.seconds.clear()
            measuring = False
            layouts: list[float] = []
            while time.monotonic() - begin < args.phase_s:
                if not measuring and time.monotonic() - begin >= args.settle_s:
                    engine.telemetry.take_report()
                    fused.seconds.clear()
                    measuring = True
                idle = engine.idle_s()
                if idle > 0 or not engine.has_unfinished_requests():
                    time.sleep(min(max(idle, 0.0005), 0.002))
                    continue
                for output in engine.step():
                    if output.finish_reason is not None:
                        start()
                if measuring and len(fused.seconds) % 200 == 0:
                    layouts.append(adjacency([s.page_table for s in engine.scheduler.running]))
            steps = [
                r
                for r in engine.telemetry.take_report().steps
                if r.decodes and r.tokens == r.decodes and r.rested_s <= 0.002
            ]
            measured = statistics.mean(1000 * (r.seconds - r.codec_s) for r in steps)
            predicted = statistics.mean(
                model.predict_ms(r.tokens, r.context_tokens)
                - r.decodes * calibration.codec_ms_per_frame
                for r in steps
            )
            fused_ms = 1000 * statistics.mean(fused.seconds)
            results[name].append((measured, predicted, fused_ms, statistics.mean(layouts)))
            print(
                f"{name}: {len(steps)} decode steps, "
                f"{statistics.mean(r.decodes for r in steps):.2f} rows, outside the codec "
                f"{measured:.2f} ms (model {predicted:.2f}, "
                f"{measured / predicted:.2f}x), fused backbone {fused_ms:.2f} ms, "
                f"neighbouring pages {statistics.mean(layouts):.2f}",
                flush=True,
            )
    print(
        "| placement | decode step outside the codec / model (median of rounds) | fused "
        "backbone call, ms | neighbouring pages |"
    )
    print("| --- | --- | --- | --- |")
    for name, rows in results.items():
        ratio = statistics.median(m / p for m, p, _, _ in rows)
        print(
            f"| {name} | {ratio:.2f}x | {statistics.median(r[2] for r in rows):.2f} | "
            f"{statistics.median(r[3] for r in rows):.2f} |"
        )


if __name__ == "__main__":
    main()
