"""The fused CPU decode against the torch path, side by side in one process: step time of the
cadenza-tiny engine (one thread, as a pinned replica runs), and what each CPU precision does to
the tokens of the ``cadenza bench engine`` Llama (31 M parameters, random weights).

    .venv/bin/python benchmarks/fused_decode_ab.py --streams 1,4,8,16 --rounds 4

Speed: for each stream count both engines hold the same streams (started one step apart,
settled 20 steps), then alternate ``--rounds`` times 60 steps each; the table gives each one's
median over rounds of the median step, in milliseconds, and the ratio. Accuracy: greedy
continuations (64 tokens) of 8 random 32-token prompts from the torch path in float32 (the
reference) and from every other setting: the share of tokens equal to the reference's before
the first divergence, and the mean of that prefix's length. A random model's logits are
nearly flat, a harsh test: a trained model's margins are wider.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import torch

from cadenza.bench.engine_throughput import MODEL, reference_llama
from cadenza.config import EngineConfig
from cadenza.contract.request import SynthesisRequest
from cadenza.contract.sampling import SamplingParams
from cadenza.engine.engine import Engine

SETTINGS = {
    "torch fp32": {"fused_cpu_decode": False, "cpu_linear_dtype": "float32"},
    "torch bf16": {"fused_cpu_decode": False, "cpu_linear_dtype": "bfloat16"},
    "fused fp32": {"fused_cpu_decode": True, "cpu_linear_dtype": "float32"},
    "fused bf16 (default)": {"fused_cpu_decode": True, "cpu_linear_dtype": "bfloat16"},
}


def tiny_engine(fused: bool, streams: int) -> Engine:
    engine = Engine.from_pretrained(
        "cadenza-tiny", engine_config=EngineConfig(fused_cpu_decode=fused)
    )
    for index in range(streams):
        engine.add_request(
            SynthesisRequest(
                f"s{index}",
                "hello there friend " * 3,
                max_duration_s=30,
                sampling=SamplingParams(seed=index),
            )
        )
        engine.step()
    for _ in range(20):
        engine.step()
    return engine


def median_step_ms(engine: Engine, steps: int = 60) -> float:
    times = []
    for _ in range(steps):
        started = time.perf_counter()
        engine.step()
        times.append(time.perf_counter() - started)
    return 1000 * statistics.median(times)


def speed(stream_counts: list[int], rounds: int) -> None:
    print("| streams | torch path ms | fused ms | torch / fused |")
    print("| --- | --- | --- | --- |")
    for streams in stream_counts:
        engines = {"torch": tiny_engine(False, streams), "fused": tiny_engine(True, streams)}
        results: dict[str, list[float]] = {name: [] for name in engines}
        for _ in range(rounds):
            for name, engine in engines.items():
                results[name].append(median_step_ms(engine))
        torch_ms, fused_ms = (statistics.median(results[n]) for n in ("torch", "fused"))
        print(f"| {streams} | {torch_ms:.2f} | {fused_ms:.2f} | {torch_ms / fused_ms:.2f} |")


def accuracy() -> None:
    torch.manual_seed(0)
    reference = reference_llama()
    prompts = torch.randint(0, MODEL["vocab_size"], (8, 32)).tolist()
    outputs = {}
    with tempfile.TemporaryDirectory() as directory:
        reference.save_pretrained(directory)
        for name, fields in SETTINGS.items():
            engine = Engine.from_pretrained(directory, engine_config=EngineConfig(**fields))
            outputs[name] = engine.generate_ids(prompts, 64)
    print("| setting | greedy tokens equal before the first divergence | mean prefix |")
    print("| --- | --- | --- |")
    base = outputs["torch fp32"]
    for name, ids in outputs.items():
        prefixes = []
        for ours, theirs in zip(ids, base, strict=True):
            same = 0
            while same < len(theirs) and ours[same] == theirs[same]:
                same += 1
            prefixes.append(same)
        share = sum(prefixes) / sum(len(t) for t in base)
        print(f"| {name} | {share:.3f} | {statistics.mean(prefixes):.1f} of 64 |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", default="1,4,8,16")
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args()
    torch.set_num_threads(1)
    speed([int(n) for n in args.streams.split(",")], args.rounds)
    print()
    accuracy()


if __name__ == "__main__":
    main()
