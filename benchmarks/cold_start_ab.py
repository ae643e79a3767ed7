"""What a fresh engine process's first steps cost, with and without the warm-up a cached
calibration gets (``calibration.warm_up``): each round starts two fresh processes, one that
serves at once and one that warms up first, and times a wave of new streams in each.

    .venv/bin/python benchmarks/cold_start_ab.py --rounds 3 --streams 16

cadenza-tiny on one thread (pinned to CPU 0 where the OS allows), its cached calibration (or
one measured now, on the first process). Prints, per process, the warm-up's seconds, the steps
before every stream had its first audio and their time, the measured over predicted time of the
first 30 and 100 decode steps and of all of them, and the longest step.
"""

from __future__ import annotations

import argparse
import os
import secrets
import subprocess
import sys
import time


def child(streams: int, warm: bool) -> None:
    import torch

    from cadenza.config import EngineConfig
    from cadenza.contract.engine_stats import StepRecord
    from cadenza.contract.request import SynthesisRequest
    from cadenza.contract.sampling import SamplingParams
    from cadenza.engine.engine import Engine
    from cadenza.engine.realtime import calibration as calibration_module

    torch.set_num_threads(1)
    torch.set_grad_enabled(False)
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {0})
    engine = Engine.from_pretrained(
        "cadenza-tiny", engine_config=EngineConfig(kv_cache_memory_bytes=1024 << 20)
    )
    real_warm_up = calibration_module.warm_up
    calibration_module.warm_up = lambda engine, calibration: []
    calibration = calibration_module.load_or_calibrate(engine)
    assert calibration is not None
    started = time.perf_counter()
    if warm:
        real_warm_up(engine, calibration)
    warm_up_s = time.perf_counter() - started
    engine.apply_calibration(calibration)
    model = calibration.model
    words = ("calm", "river", "stone", "light", "north", "paper", "voice", "steady")
    for index in range(streams):
        text = " ".join(secrets.choice(words) for _ in range(24))[: 60 + 3 * index]
        engine.add_request(
            SynthesisRequest(
                f"wave-{index}", text, max_duration_s=4, sampling=SamplingParams(seed=index)
            )
        )
    engine.take_report()
    while engine.has_unfinished_requests():
        engine.step()
    steps = engine.take_report().steps
    decodes = [s for s in steps if s.decodes and s.tokens <= 2 * s.decodes]
    prompts = [s for s in steps if s.tokens > 2 * s.decodes]

    def ratio(chosen: list[StepRecord]) -> float:
        measured = sum(s.seconds for s in chosen) * 1000.0
        return measured / sum(model.predict_ms(s.tokens, s.context_tokens) for s in chosen)

    print(
        f"| {'warm-up' if warm else 'cold'} | {warm_up_s:.1f} s | {len(prompts)} / "
        f"{1000 * sum(s.seconds for s in prompts):.0f} ms | {ratio(decodes[:30]):.2f} | "
        f"{ratio(decodes[:100]):.2f} | {ratio(decodes):.2f} | "
        f"{1000 * max(s.seconds for s in steps):.0f} ms |",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--streams", type=int, default=16)
    parser.add_argument("--child", choices=("cold", "warm"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.streams, args.child == "warm")
        return
    print(
        "| process | warm-up | prompt steps / time | first 30 steps / model | first 100 | all "
        "| longest step |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for _ in range(args.rounds):
        for kind in ("cold", "warm"):
            subprocess.run(
                [sys.executable, __file__, "--child", kind, "--streams", str(args.streams)],
                check=True,
                stderr=subprocess.DEVNULL,
            )


if __name__ == "__main__":
    main()
