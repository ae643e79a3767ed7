"""The two ways :mod:`cadenza.engine.sampler` draws, side by side in one process: by rank
(top-k, then inverse CDF in rank order; what top-p needs) and by threshold (a partition finds
each row's k-th value, then inverse CDF in id order; the default without top-p).
cadenza-tiny's shape: ``K = 8`` codebooks of 1,026 ids, ``top_k = 250``, one sequence per
stream.

    .venv/bin/python benchmarks/sampler_draw.py --rounds 200

Prints the median microseconds per draw of each, per batch size, alternating call by call.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from cadenza.contract.sampling import SamplingParams
from cadenza.engine.sampler import _draw_ranked, _draw_thresholded
from cadenza.engine.sequence import Sequence


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=200)
    args = parser.parse_args()
    torch.manual_seed(0)
    for batch in (1, 4, 16, 32):
        logits = torch.randn(batch, 8, 1026)
        seqs = [
            Sequence(f"s{i}", [[0] * 8], SamplingParams(seed=i), torch.Generator(), 10)
            for i in range(batch)
        ]
        uniform = torch.rand(batch, 8)
        times: dict[str, list[float]] = {"ranked": [], "thresholded": []}
        for _ in range(args.rounds):
            for name, draw in (("ranked", _draw_ranked), ("thresholded", _draw_thresholded)):
                started = time.perf_counter()
                draw(seqs, logits, uniform)
                times[name].append(time.perf_counter() - started)
        ranked, thresholded = (1e6 * statistics.median(times[n]) for n in times)
        print(
            f"batch {batch:2d}: ranked {ranked:7.0f} us, thresholded {thresholded:7.0f} us, "
            f"ratio {ranked / thresholded:.2f}"
        )


if __name__ == "__main__":
    main()
