"""The cadenza-tiny engine step with the CPU precisions on and off, side by side in one run:
fp32 prepacked linears and fp32 codec (the earlier default), bf16 linears and codec with every
product packed, and the default (bf16, small products through plain ``F.linear``).

    .venv/bin/python benchmarks/cpu_step_ab.py --streams 1,4,16,24 --rounds 3

For each stream count the variants alternate ``--rounds`` times; each run starts the streams
one step apart, lets them settle for 30 steps, then takes the mean of 120 steps (the codec
decode amortised in it); the table shows each variant's median over rounds, in milliseconds.
"""

from __future__ import annotations

import argparse
import statistics
import time

import cadenza.kernels.cpu_linear as cpu_linear
from cadenza.config import CpuConfig
from cadenza.contract.request import SynthesisRequest
from cadenza.contract.sampling import SamplingParams
from cadenza.engine.engine import Engine

FP32 = {"linear_dtype": "float32", "codec_dtype": "float32"}  # [cpu]
VARIANTS = {
    "fp32 packed": (0, FP32),
    "bf16, all packed": (0, {}),
    "bf16, small products F.linear": (cpu_linear.AMX_SMALL_PRODUCT_MACS, {}),
}


def mean_step_ms(streams: int, small_product_macs: int, config: dict[str, str]) -> float:
    cpu_linear.SMALL_PRODUCT_MACS = small_product_macs
    engine = Engine.from_pretrained("cadenza-tiny", cpu=CpuConfig(**config))
    for index in range(streams):
        engine.add_request(
            SynthesisRequest(
                request_id=f"s{index}",
                text="hello there friend " * 3,
                max_duration_s=20,
                sampling=SamplingParams(seed=index),
            )
        )
        engine.step()
    for _ in range(30):
        engine.step()
    times = []
    for _ in range(120):
        started = time.perf_counter()
        engine.step()
        times.append(time.perf_counter() - started)
    return 1000 * statistics.mean(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", default="1,4,16,24")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    print("| streams | " + " | ".join(VARIANTS) + " |")
    print("| --- |" + " --- |" * len(VARIANTS))
    for streams in (int(s) for s in args.streams.split(",")):
        runs: dict[str, list[float]] = {name: [] for name in VARIANTS}
        for _ in range(args.rounds):
            for name, (macs, config) in VARIANTS.items():
                runs[name].append(mean_step_ms(streams, macs, config))
        cells = " | ".join(f"{statistics.median(v):.2f}" for v in runs.values())
        print(f"| {streams} | {cells} |", flush=True)


if __name__ == "__main__":
    main()
