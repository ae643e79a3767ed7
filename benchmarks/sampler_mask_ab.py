"""The layout mask in the sampler two ways, side by side in one process: ``masked_fill`` of
the whole batch (before) against filling only the ids the mask bans (the sampler's
``_exclude``), each timed inside a whole ``sample_rows`` call.

    .venv/bin/python benchmarks/sampler_mask_ab.py --rounds 5

cadenza-tiny's mask (8 codebooks x 1,026 ids, 15 banned) and sequences, one thread; random
logits. Prints the median microseconds of a ``sample_rows`` call per row count, rounds
alternating between the two.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

import cadenza.engine.sampler as sampler
from cadenza.config import EngineConfig
from cadenza.contract.request import SynthesisRequest
from cadenza.contract.sampling import SamplingParams
from cadenza.engine.engine import Engine
from cadenza.engine.sampling_masks import MaskPlan


def masked_fill(logits: torch.Tensor, plan: MaskPlan) -> torch.Tensor:
    return logits.masked_fill(plan.excluded, float("-inf"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", default="1,5,10,16")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows = [int(n) for n in args.rows.split(",")]
    engine = Engine.from_pretrained(
        "cadenza-tiny", engine_config=EngineConfig(kv_cache_memory_bytes=64 << 20)
    )
    for i in range(max(rows)):
        engine.add_request(
            SynthesisRequest(
                f"r{i}", "hello there " * 4, max_duration_s=5, sampling=SamplingParams(seed=i)
            )
        )
    running = engine.scheduler.running
    while len(running) < max(rows) or any(seq.is_prefilling for seq in running):
        engine.step()
    masks = engine.runner.masks
    ways: dict[str, Callable[[torch.Tensor, MaskPlan], torch.Tensor]] = {
        "masked_fill": masked_fill,
        "banned ids": sampler._exclude,
    }
    print("| rows | masked_fill us | banned ids us | ratio |")
    print("| --- | --- | --- | --- |")
    for count in rows:
        seqs = running[:count]
        logits = torch.randn(count, 8, 1026)
        constraints = [engine.runner.layout.constraints(seq) for seq in seqs]
        medians: dict[str, list[float]] = {name: [] for name in ways}
        for _ in range(args.rounds):
            for name, way in ways.items():
                sampler._exclude = way  # type: ignore[assignment]
                times = []
                for _ in range(210):
                    started = time.perf_counter()
                    sampler.sample_rows(logits, seqs, masks, constraints)
                    times.append(time.perf_counter() - started)
                medians[name].append(statistics.median(times[10:]))
        before, after = (1e6 * statistics.median(medians[name]) for name in ways)
        print(f"| {count} | {before:.0f} | {after:.0f} | {before / after:.2f} |")
    sampler._exclude = ways["banned ids"]  # type: ignore[assignment]


if __name__ == "__main__":
    main()
