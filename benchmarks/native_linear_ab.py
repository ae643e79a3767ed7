"""bf16 linears outside the fused decode step: oneDNN's packed product against cadenza's native
one (``cpu_bf16_linear.cpp``), product by product, then a whole engine under churn.

    .venv/bin/python benchmarks/native_linear_ab.py --rounds 2 --streams 12 --seconds 25

Products: cadenza-tiny's prompt-path layers and output heads, and two large layers, one thread
(two for the large ones), the two paths alternating, medians of five; the native output is
compared with the float64 product of the bf16-rounded operands. Then
``churn_in_process.py`` (one engine on one core, closed-loop churn) with and without
``--onednn-linears``, alternating, ``--rounds`` times: rows a second and the decode step outside
the codec.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

from cadenza.kernels.cpu_linear import PackedLinear, native_linear_library

SHAPES = (  # (outputs, inputs, rows, threads)
    (256, 256, 8, 1),
    (256, 256, 64, 1),
    (768, 256, 64, 1),
    (256, 768, 64, 1),
    (8208, 256, 1, 1),
    (8208, 256, 8, 1),
    (8208, 256, 16, 1),
    (8208, 256, 200, 1),
    (3072, 3072, 1, 2),
    (3072, 3072, 128, 2),
    (8192, 3072, 16, 2),
)


def _median_call_s(layer: PackedLinear, x: torch.Tensor, reps: int) -> float:
    times = []
    for _ in range(5):
        started = time.perf_counter()
        for _ in range(reps):
            layer(x)
        times.append((time.perf_counter() - started) / reps)
    return statistics.median(times)


def products() -> None:
    print("| outputs x inputs | rows | threads | oneDNN ms | native ms | oneDNN / native "
          "| native max error |")  # fmt: skip
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for outputs, inputs, rows, threads in SHAPES:
        torch.set_num_threads(threads)
        weight = torch.randn(outputs, inputs) * 0.05
        native = PackedLinear(weight, torch.bfloat16)
        assert native.pairs is not None, "no native bf16 product on this machine"
        onednn = PackedLinear(weight, torch.bfloat16)
        onednn.pairs = None
        onednn.packed = torch.ops.mkldnn._reorder_linear_weight(weight.bfloat16())
        x = torch.randn(rows, inputs)
        exact = (x.bfloat16().double() @ weight.bfloat16().double().T).float()
        error = float((native(x) - exact).abs().max())
        reps = max(5, int(5e7 / (rows * outputs * inputs)))
        pairs = [(_median_call_s(onednn, x, reps), _median_call_s(native, x, reps))]
        pairs.append((_median_call_s(onednn, x, reps), _median_call_s(native, x, reps)))
        a = statistics.median(p[0] for p in pairs)
        b = statistics.median(p[1] for p in pairs)
        print(f"| {outputs} x {inputs} | {rows} | {threads} | {1e3 * a:.3f} | {1e3 * b:.3f} "
              f"| {a / b:.2f} | {error:.1e} |")  # fmt: skip


def churn(rounds: int, streams: int, seconds: float) -> None:
    script = Path(__file__).with_name("churn_in_process.py")
    for round_ in range(rounds):
        for label, extra in (("oneDNN", ["--onednn-linears"]), ("native", [])):
            command = [sys.executable, str(script), "--streams", str(streams)]
            command += ["--seconds", str(seconds), *extra]
            out = subprocess.run(command, capture_output=True, text=True, check=True).stdout
            lines = [
                line
                for line in out.splitlines()
                if "rows/s" in line or line.startswith("| decode") or line.startswith("| prompt")
            ]
            print(f"round {round_ + 1}, {label}:", *lines, sep="\n  ")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--streams", type=int, default=12)
    parser.add_argument("--seconds", type=float, default=25.0)
    args = parser.parse_args()
    if native_linear_library() is None:
        sys.exit("no native bf16 product on this machine (AVX512-BF16 and a C++ compiler)")
    products()
    churn(args.rounds, args.streams, args.seconds)


if __name__ == "__main__":
    main()
