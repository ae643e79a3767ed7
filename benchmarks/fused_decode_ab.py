"""The fused CPU decode against the torch path, side by side in one process: step time of the
cadenza-tiny engine (one thread, as a pinned replica runs), and what each CPU precision does to
the tokens of the ``cadenza bench engine`` Llama (31 M parameters, random weights).

    .venv/bin/python benchmarks/fused_decode_ab.py --streams 1,4,8,16 --rounds 4

Speed: for each stream count the torch path, the fused step with a float32 KV cache and the
default (fused, bf16 KV where the CPU multiplies in bf16) hold the same streams (started one
step apart, settled 20 steps; with ``--long``, 10-second utterances settled 400 steps, contexts
of 500-800 positions), then alternate ``--rounds`` times 60 steps each; the table gives each
one's median over rounds of the median step, in milliseconds, and the torch / default ratio.
Accuracy: greedy continuations (64 tokens) of 8 random 32-token prompts from the torch path in
float32 (the reference) and from every other setting: the share of tokens equal to the
reference's before the first divergence, and the mean of that prefix's length. A random
model's logits are nearly flat, a harsh test: a trained model's margins are wider.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from typing import Any

import torch

from cadenza.bench.engine_throughput import MODEL, reference_llama
from cadenza.config import CpuConfig, EngineConfig
from cadenza.contract.request import SynthesisRequest
from cadenza.contract.sampling import SamplingParams
from cadenza.engine.engine import Engine
from cadenza.engine.offline import generate_ids
from cadenza.kernels.cpu_linear import bf16_packing_available

# [cpu] fused_decode and linear_dtype, [engine] kv_dtype
SETTINGS = {
    "torch fp32": {"fused_decode": False, "linear_dtype": "float32", "kv_dtype": "fp32"},
    "torch bf16": {"fused_decode": False, "linear_dtype": "bfloat16", "kv_dtype": "fp32"},
    "fused fp32": {"fused_decode": True, "linear_dtype": "float32", "kv_dtype": "fp32"},
    "fused bf16, fp32 KV": {"fused_decode": True, "linear_dtype": "bfloat16", "kv_dtype": "fp32"},
    "fused bf16, bf16 KV (default)": {
        "fused_decode": True,
        "linear_dtype": "bfloat16",
        "kv_dtype": "auto",
    },
}
# The engines the speed table compares (the CPU's default linear precision for each).
ENGINES: dict[str, dict[str, Any]] = {
    "torch": {"fused_decode": False, "kv_dtype": "fp32"},
    "fused, fp32 KV": {"fused_decode": True, "kv_dtype": "fp32"},
    "fused (default)": {"fused_decode": True},
}


def sections(fields: dict[str, Any], **engine: Any) -> dict[str, Any]:
    """``fields`` as :meth:`Engine.from_pretrained`'s ``engine_config`` and ``cpu``."""
    cpu = {key: value for key, value in fields.items() if key in CpuConfig.model_fields}
    engine.update({key: value for key, value in fields.items() if key not in cpu})
    return {"engine_config": EngineConfig(**engine), "cpu": CpuConfig(**cpu)}


def tiny_engine(fields: dict[str, Any], streams: int, text: str, settle: int) -> Engine:
    engine = Engine.from_pretrained(
        "cadenza-tiny", **sections(fields, kv_cache_memory_bytes=512 << 20)
    )
    for index in range(streams):
        engine.add_request(
            SynthesisRequest(
                f"s{index}", text, max_duration_s=30, sampling=SamplingParams(seed=index)
            )
        )
        engine.step()
    for _ in range(settle):
        engine.step()
    return engine


def median_step_ms(engine: Engine, steps: int = 60) -> float:
    times = []
    for _ in range(steps):
        started = time.perf_counter()
        engine.step()
        times.append(time.perf_counter() - started)
    return 1000 * statistics.median(times)


def speed(stream_counts: list[int], rounds: int, text: str, settle: int) -> None:
    names = list(ENGINES)
    print("| streams | " + " | ".join(f"{n} ms" for n in names) + " | torch / default |")
    print("| --- " * (len(names) + 2) + "|")
    for streams in stream_counts:
        engines = {
            name: tiny_engine(fields, streams, text, settle) for name, fields in ENGINES.items()
        }
        results: dict[str, list[float]] = {name: [] for name in engines}
        for _ in range(rounds):
            for name, engine in engines.items():
                results[name].append(median_step_ms(engine))
        medians = [statistics.median(results[n]) for n in names]
        cells = " | ".join(f"{m:.2f}" for m in medians)
        print(f"| {streams} | {cells} | {medians[0] / medians[-1]:.2f} |")


def accuracy() -> None:
    torch.manual_seed(0)
    reference = reference_llama()
    prompts = torch.randint(0, MODEL["vocab_size"], (8, 32)).tolist()
    outputs = {}
    with tempfile.TemporaryDirectory() as directory:
        reference.save_pretrained(directory)
        for name, fields in SETTINGS.items():
            if fields["linear_dtype"] == "bfloat16" and not bf16_packing_available():
                print(f"({name}: skipped, oneDNN packs no bf16 weights on this CPU)")
                continue
            engine = Engine.from_pretrained(directory, **sections(fields))
            outputs[name] = generate_ids(engine, prompts, 64)
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
    parser.add_argument(
        "--long",
        action="store_true",
        help="10-second utterances (contexts of 500-800 positions) instead of 3-second ones",
    )
    args = parser.parse_args()
    torch.set_num_threads(1)
    counts = [int(n) for n in args.streams.split(",")]
    if args.long:
        speed(counts, args.rounds, "a stream of moderate length that goes on for a while " * 6, 400)
    else:
        speed(counts, args.rounds, "hello there friend " * 3, 20)
    print()
    accuracy()


if __name__ == "__main__":
    main()
