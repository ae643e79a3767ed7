"""The CPU decode step with the dense decode copy and with page gathering, side by side:
two cadenza-tiny engines in one process, the same streams, their steps alternating one by
one (so a machine whose speed drifts slows both alike).

    .venv/bin/python benchmarks/dense_decode_ab.py --streams 16 --seconds 10 --rounds 2

Every stream reads a text of ``--seconds`` of audio (about 14 characters a second), all
started together. Prints, per round, each engine's mean step (codec chunks included) over the
four quarters of the run, i.e. at growing context, and their ratio.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import time

from cadenza.contract.request import SynthesisRequest
from cadenza.contract.sampling import SamplingParams
from cadenza.engine.engine import Engine


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    memory = max(args.streams, 4) << 24
    engines = {
        "gather": Engine.from_pretrained("cadenza-tiny", kv_cache_memory_bytes=memory),
        "dense": Engine.from_pretrained("cadenza-tiny", kv_cache_memory_bytes=memory),
    }
    engines["gather"].runner.dense_kv = None
    text = ("a stream reads a sentence of moderate length. " * 40)[: int(14 * args.seconds)]
    for round_index in range(args.rounds):
        times: dict[str, list[float]] = {name: [] for name in engines}
        for engine in engines.values():
            for i in range(args.streams):
                engine.add_request(
                    SynthesisRequest(
                        f"{round_index}-{i}",
                        text,
                        max_duration_s=args.seconds + 1,
                        sampling=SamplingParams(seed=i),
                    )
                )
        while any(engine.has_unfinished_requests() for engine in engines.values()):
            for name, engine in engines.items():
                if engine.has_unfinished_requests():
                    started = time.perf_counter()
                    engine.step()
                    times[name].append(time.perf_counter() - started)
        steps = min(len(t) for t in times.values())
        bounds = [2, steps // 4, steps // 2, 3 * steps // 4, steps]
        means = {
            name: [round(1000 * statistics.mean(t[a:b]), 2) for a, b in itertools.pairwise(bounds)]
            for name, t in times.items()
        }
        ratios = [round(g / d, 2) for g, d in zip(means["gather"], means["dense"], strict=True)]
        print(
            f"round {round_index}: {steps} steps; mean step ms by quarter: gather "
            f"{means['gather']}, dense {means['dense']}; gather / dense {ratios}",
            flush=True,
        )


if __name__ == "__main__":
    main()
