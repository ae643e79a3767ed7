"""The sampler's thresholded draw, native against torch, in one process: one ``[S, 8, 1026]``
batch of cadenza-tiny logits (default sampling: top-k 250), one thread.

    .venv/bin/python benchmarks/sampler_native_ab.py --streams 10 --rounds 5

Prints microseconds per draw per round and the medians.
"""

from __future__ import annotations

import argparse
import statistics
import time
from types import SimpleNamespace

import torch

from cadenza.contract.sampling import SamplingParams
from cadenza.engine import sampler
from cadenza.kernels import cpu_sampling


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    if not cpu_sampling.available():
        raise SystemExit("no C++ compiler: the native draw is not built")
    logits = torch.randn(args.streams, 8, 1026)
    seqs = [SimpleNamespace(sampling=SamplingParams()) for _ in range(args.streams)]
    uniform = torch.rand(args.streams, 8)
    results: dict[str, list[float]] = {"torch": [], "native": []}
    available = cpu_sampling.available
    try:
        for _ in range(args.rounds):
            for name in results:
                cpu_sampling.available = lambda name=name: name == "native"  # type: ignore[misc]
                sampler._draw_thresholded(seqs, logits, uniform)  # type: ignore[arg-type]
                started = time.perf_counter()
                for _ in range(200):
                    sampler._draw_thresholded(seqs, logits, uniform)  # type: ignore[arg-type]
                results[name].append(1e6 * (time.perf_counter() - started) / 200)
    finally:
        cpu_sampling.available = available
    for name, values in results.items():
        rounded = [round(v) for v in values]
        print(f"{name}: {rounded} -> median {statistics.median(values):.0f} us a draw")


if __name__ == "__main__":
    main()
