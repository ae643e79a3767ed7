"""The engine's decode step at two commits, side by side in one process: the working tree's
``cadenza`` against an earlier commit's, exported next to it as the package ``cadenza_base``.
Both engines serve the ``cadenza bench engine`` Llama (31 M parameters, greedy, same prompts),
or with ``--tiny`` the default model ``cadenza-tiny`` as it serves (text requests, default
sampling, seeded; its steps include the codec's); their runs alternate ``--rounds`` times, so a
machine whose speed drifts slows both alike.

    .venv/bin/python benchmarks/engine_ab.py --base bb40957 --batch 16 --prompt 32 --new 64
    .venv/bin/python benchmarks/engine_ab.py --base bb40957 --batch 16 --tiny --seconds 10

Prints one line: each side's decode step (median over rounds of each round's median step; of
each round's mean step with ``--tiny``, so that the codec's chunks count), their ratio, and
the share of generated tokens the two agree on (differences come from float rounding in a
random model whose logits are nearly flat, and with ``--tiny`` from a changed sampler).
"""

from __future__ import annotations

import argparse
import importlib
import io
import re
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from cadenza.bench import engine_throughput

REPO = Path(__file__).resolve().parents[1]


def export_as_base(commit: str, into: Path) -> None:
    """Write ``commit``'s ``cadenza`` package under ``into`` as ``cadenza_base``."""
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", commit, "cadenza"], check=True, capture_output=True
    ).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    (into / "cadenza").rename(into / "cadenza_base")
    for path in (into / "cadenza_base").rglob("*.py"):
        text = path.read_text()
        text = re.sub(r"(from|import) cadenza\b", r"\1 cadenza_base", text)
        text = text.replace('"cadenza.', '"cadenza_base.')
        path.write_text(text)


def build(package: str, checkpoint: str, batch: int, positions: int) -> tuple[Any, Any]:
    config = importlib.import_module(f"{package}.config")
    engine = importlib.import_module(f"{package}.engine.engine")
    sampling = importlib.import_module(f"{package}.contract.sampling")
    settings = config.EngineConfig(
        page_size=16,
        max_num_seqs=batch,
        max_num_batched_tokens=512,
        enable_prefix_caching=False,
        kv_cache_memory_bytes=2 * batch * positions * engine_throughput.engine_kv_bytes_per_token(),
    )
    model = engine.Engine.from_pretrained(checkpoint, engine_config=settings)
    return model, sampling.SamplingParams(temperature=0.0, top_k=0)


def build_tiny(package: str, batch: int, seconds: float) -> tuple[Any, Any]:
    engine = importlib.import_module(f"{package}.engine.engine")
    request = importlib.import_module(f"{package}.contract.request")
    sampling = importlib.import_module(f"{package}.contract.sampling")
    model = engine.Engine.from_pretrained("cadenza-tiny", kv_cache_memory_bytes=batch << 24)

    def add(i: int) -> Any:
        # The stream's length follows its text (about 14 characters a second).
        text = (f"stream {i} reads a sentence of moderate length. " * 20)[: int(14 * seconds)]
        request_id = f"ab-{i}-{time.monotonic_ns()}"
        model.add_request(
            request.SynthesisRequest(
                request_id,
                text,
                max_duration_s=seconds + 1,
                sampling=sampling.SamplingParams(seed=i),
            )
        )
        return model.sequence(request_id)

    return model, add


def run_tiny(engine: Any, add: Any, batch: int) -> tuple[float, list[Any]]:
    seqs = [add(i) for i in range(batch)]
    steps = []
    while engine.has_unfinished_requests():
        started = time.perf_counter()
        engine.step()
        steps.append(time.perf_counter() - started)
    # The mean, not the median: the codec decodes a chunk every few steps, and its share of
    # the work belongs in the comparison.
    return statistics.mean(steps[2:]), [seq.token_rows for seq in seqs]


def run_once(
    engine: Any, greedy: Any, prompts: list[list[int]], new: int
) -> tuple[float, list[Any]]:
    seqs = [
        engine.add_tokens(f"ab-{i}-{time.monotonic_ns()}", [[t] for t in p], new, greedy)
        for i, p in enumerate(prompts)
    ]
    steps = []
    while engine.has_unfinished_requests():
        started = time.perf_counter()
        engine.step()
        steps.append(time.perf_counter() - started)
    return statistics.median(steps[2:]), [seq.token_rows[-new:] for seq in seqs]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", required=True, help="the commit to compare against")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--prompt", type=int, default=32, help="prompt tokens per stream")
    parser.add_argument("--new", type=int, default=64, help="generated tokens per stream")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--tiny", action="store_true", help="serve cadenza-tiny, sampled")
    parser.add_argument("--seconds", type=float, default=4.0, help="--tiny: audio per stream")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        export_as_base(args.base, Path(scratch))
        sys.path.insert(0, scratch)
        torch.manual_seed(0)
        positions = args.prompt + args.new + 16
        if args.tiny:
            sides = {
                name: build_tiny(name, args.batch, args.seconds)
                for name in ("cadenza_base", "cadenza")
            }
        else:
            reference = engine_throughput.reference_llama()
            reference.save_pretrained(scratch + "/model")
            sides = {
                name: build(name, scratch + "/model", args.batch, positions)
                for name in ("cadenza_base", "cadenza")
            }
        prompts = torch.randint(0, 8192, (args.batch, args.prompt)).tolist()
        times: dict[str, list[float]] = {name: [] for name in sides}
        rows: dict[str, list[Any]] = {}
        for _ in range(args.rounds):
            for name, (engine, extra) in sides.items():
                if args.tiny:
                    step, rows[name] = run_tiny(engine, extra, args.batch)
                else:
                    step, rows[name] = run_once(engine, extra, prompts, args.new)
                times[name].append(step)
    base, ours = (statistics.median(times[n]) for n in ("cadenza_base", "cadenza"))
    pairs = [
        a == b
        for x, y in zip(rows["cadenza_base"], rows["cadenza"], strict=True)
        for a, b in zip(x, y, strict=True)
    ]
    workload = "cadenza-tiny, sampled" if args.tiny else f"prompt {args.prompt}, {args.new} new"
    print(
        f"batch {args.batch}, {workload}: {args.base} "
        f"{1000 * base:.2f} ms, working tree {1000 * ours:.2f} ms, ratio {base / ours:.2f}, "
        f"same tokens {sum(pairs) / len(pairs):.3f}"
    )


if __name__ == "__main__":
    main()
