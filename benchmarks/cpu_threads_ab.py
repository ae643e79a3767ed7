"""The cadenza-tiny engine step on two torch threads and on one, side by side in one process:
how much of a step the second core carries (docs/journal/2026-12-02-replicas-on-their-own-cores.md).

    .venv/bin/python benchmarks/cpu_threads_ab.py --streams 2,16 --rounds 3

For each stream count and round, the same engine runs a batch of streams on two threads, then
on one (``torch.set_num_threads``): 40 steps to settle, then the mean of ``--steps`` steps
(the codec decode amortised in it), then the streams run out. Prints one line per round.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from cadenza.contract.request import SynthesisRequest
from cadenza.contract.sampling import SamplingParams
from cadenza.engine.engine import Engine

TEXT = ("stream reads a sentence of moderate length about four seconds long " * 2)[:100]


def mean_step_ms(engine: Engine, streams: int, steps: int) -> float:
    """Start ``streams`` streams, settle, return the mean of ``steps`` steps; drain."""
    for i in range(streams):
        engine.add_request(
            SynthesisRequest(
                f"{time.monotonic_ns()}-{i}",
                TEXT,
                max_duration_s=8.0,
                sampling=SamplingParams(seed=i),
            )
        )
    for _ in range(40):
        engine.step()
    times = []
    for _ in range(steps):
        started = time.perf_counter()
        engine.step()
        times.append(time.perf_counter() - started)
    while engine.has_unfinished_requests():
        engine.step()
    return 1000.0 * statistics.mean(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", default="2,16")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=150)
    args = parser.parse_args()
    for streams in (int(s) for s in args.streams.split(",")):
        engine = Engine.from_pretrained("cadenza-tiny", kv_cache_memory_bytes=max(streams, 4) << 24)
        for round_index in range(args.rounds):
            torch.set_num_threads(2)
            two = mean_step_ms(engine, streams, args.steps)
            torch.set_num_threads(1)
            one = mean_step_ms(engine, streams, args.steps)
            print(
                f"{streams} streams, round {round_index}: two threads {two:.2f} ms, "
                f"one thread {one:.2f} ms, one / two {one / two:.2f}",
                flush=True,
            )


if __name__ == "__main__":
    main()
