"""What a wait before each step costs: cadenza-tiny decode steps run back to back against the
same steps each after a sleep of 5 or 10 ms (what one step per frame at the lead cap looks
like), alternating in one process.

    .venv/bin/python benchmarks/cold_steps.py --rounds 4

Prints each gap's median decode step per round and the median over rounds, in milliseconds.
"""

from __future__ import annotations

import argparse
import statistics
import time

from cadenza.contract.request import SynthesisRequest
from cadenza.contract.sampling import SamplingParams
from cadenza.engine.engine import Engine


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--streams", type=int, default=2)
    args = parser.parse_args()
    engine = Engine.from_pretrained("cadenza-tiny", kv_cache_memory_bytes=64 << 20)
    gaps_ms = (0, 5, 10)
    results: dict[int, list[float]] = {gap: [] for gap in gaps_ms}
    for round_index in range(args.rounds):
        for gap in gaps_ms:
            for index in range(args.streams):
                engine.add_request(
                    SynthesisRequest(
                        f"r{round_index}-{gap}-{index}",
                        "a stream of moderate length " * 2,
                        max_duration_s=3.0,
                        sampling=SamplingParams(seed=index),
                    )
                )
            steps = []
            while engine.has_unfinished_requests():
                if gap:
                    time.sleep(gap / 1000)
                started = time.perf_counter()
                engine.step()
                elapsed = time.perf_counter() - started
                record = engine.telemetry.last_step
                if record is not None and record.tokens == record.decodes == args.streams:
                    steps.append(elapsed)
            results[gap].append(1000 * statistics.median(steps))
    for gap, values in results.items():
        rounded = [round(v, 2) for v in values]
        print(f"gap {gap} ms: {rounded} -> median {statistics.median(values):.2f} ms")


if __name__ == "__main__":
    main()
