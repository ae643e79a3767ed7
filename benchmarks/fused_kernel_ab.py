"""The fused CPU decode step built from this checkout's ``cpu_decode_layers.cpp`` against the
same kernel at another commit, side by side in one engine: steps alternate between the two
builds (each with its own packed weights, on the same KV cache), so drift lands on both.

    .venv/bin/python benchmarks/fused_kernel_ab.py --base HEAD~1 --streams 10,16

cadenza-tiny on one thread, pinned to CPU 0 where the OS allows, at ``--dtype`` (``auto``: the
engine's choice; ``float32`` for the float32 products). For each stream count,
``--streams`` utterances of about 14 s run from start to end; every pure decode step of the
whole batch is timed. Prints each build's median step and the least-squares fit ``fixed +
per_position * positions`` over the steps (the attention's cost per position the step's rows
read). Both builds' weight copies share the caches, so the fixed part reads higher than one
build alone; the ratios are what to read.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from cadenza.contract.request import SynthesisRequest
from cadenza.contract.sampling import SamplingParams
from cadenza.engine.engine import Engine
from cadenza.kernels.fused_cpu_decode import LIBRARY, FusedCpuDecode
from cadenza.kernels.native import loader
from cadenza.kernels.native.entry_points import LIBRARIES

KERNELS = Path(__file__).resolve().parent.parent / "cadenza" / "kernels" / "native"
SOURCE = LIBRARIES[LIBRARY].source
WORDS = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "theta", "kappa", "lambda", "sigma"]


def base_library(base: str, directory: Path) -> ctypes.CDLL:
    """The kernel (and the headers it includes) as of commit ``base``, built here at the
    loader's level, its entry points declared as the table says (a commit from before the
    kernels moved into ``kernels/native/`` is read from ``kernels/``)."""
    for path in [KERNELS / SOURCE, *KERNELS.glob("*.h")]:
        text = None
        for folder in ("cadenza/kernels/native", "cadenza/kernels"):
            shown = subprocess.run(
                ["git", "show", f"{base}:{folder}/{path.name}"],
                capture_output=True,
                text=True,
                check=False,
            )
            if shown.returncode == 0:
                text = shown.stdout
                break
        assert text is not None, f"{path.name} is not in {base}"
        (directory / path.name).write_text(text)
    compiler = loader.find_compiler()
    assert compiler is not None, "no C++ compiler"
    target = directory / "base.so"
    loader.build(directory / SOURCE, compiler, target, loader.default_level())
    return loader.declare(ctypes.CDLL(str(target)), LIBRARY)


def run(streams: int, library: ctypes.CDLL, dtype: str) -> dict[str, list[tuple[int, float]]]:
    engine = Engine.from_pretrained("cadenza-tiny", kv_cache_memory_bytes=256 << 20, dtype=dtype)
    model: Any = engine.model
    this = model.fused_decode
    assert this is not None, "no fused CPU decode on this machine"
    builds = {"this": this, "base": FusedCpuDecode(model.backbone, this.weight_dtype, library)}
    steps: dict[str, list[tuple[int, float]]] = {name: [] for name in builds}
    turn = [0]

    class Alternating:
        applies = builds["this"].applies

        def __call__(self, embeddings: Any, rotary: Any, context: Any, kv_cache: Any) -> Any:
            name = "this" if turn[0] % 2 == 0 else "base"
            turn[0] += 1
            started = time.perf_counter()
            out = builds[name](embeddings, rotary, context, kv_cache)
            seconds = time.perf_counter() - started
            if not context.prefills and embeddings.shape[0] == streams:
                steps[name].append((int(context.decode_seq_lens.sum()), seconds))
            return out

    model.backbone.fused_decode = Alternating()
    for i in range(streams):
        text = " ".join(WORDS[i % len(WORDS) :] + WORDS[: i % len(WORDS)]) * 2
        engine.add_request(
            SynthesisRequest(
                request_id=f"s{i}", text=text, max_duration_s=14.0, sampling=SamplingParams(seed=i)
            )
        )
    while engine.has_unfinished_requests():
        engine.step()
    return steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", default="HEAD~1", help="the commit to compare against")
    parser.add_argument("--streams", default="10,16")
    parser.add_argument(
        "--dtype", default="auto", help="the engine's precision (float32: float32 products)"
    )
    args = parser.parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {0})
    torch.set_num_threads(1)
    torch.set_grad_enabled(False)
    with tempfile.TemporaryDirectory() as directory:
        library = base_library(args.base, Path(directory))
        print("| streams | build | steps | median step ms | fixed ms | ms per 1k positions |")
        print("| --- | --- | --- | --- | --- | --- |")
        for streams in (int(n) for n in args.streams.split(",")):
            medians = {}
            for name, steps in run(streams, library, args.dtype).items():
                data = np.array(steps)
                positions, ms = data[:, 0], 1000.0 * data[:, 1]
                design = np.vstack([np.ones_like(positions), positions / 1000.0]).T
                (fixed, per_k), *_ = np.linalg.lstsq(design, ms, rcond=None)
                medians[name] = float(np.median(ms))
                label = "this checkout" if name == "this" else args.base
                print(
                    f"| {streams} | {label} | {len(steps)} | {medians[name]:.3f} | {fixed:.3f} "
                    f"| {per_k:.4f} |"
                )
            print(f"(base / this median step at {streams} streams: "
                  f"{medians['base'] / medians['this']:.2f}x)")  # fmt: skip


if __name__ == "__main__":
    main()
