"""Run ``cadenza loadtest`` in every arrival pattern the on-time guarantee covers, several
times, against a running server, and print one table row per run (docs/benchmarks.md).

Patterns, each relative to the server's own claim ``N`` (``/v1/capacity`` ``max_streams``,
read before every run): closed loop at N, 2N and 3N streams; Poisson arrivals at three times
the rate N streams of the mean utterance need; and a burst of 3N streams opened at once.

    .venv/bin/python benchmarks/overload_matrix.py --url http://127.0.0.1:8000 --runs 5 \\
        --duration 20 --out /tmp/matrix
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import httpx

TEXT = (40, 120)  # the harness's default text lengths
CHARS_PER_SECOND = 14.0  # the server's default limits.chars_per_second


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--duration", type=float, default=20.0)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--patterns", default="1x,2x,3x,poisson3x,burst3x")
    args = parser.parse_args()
    mean_audio_s = sum(TEXT) / 2 / CHARS_PER_SECOND
    print(
        "| pattern | run | claim N | offered | admitted | queued | refused | admitted C100 "
        "| admitted TTFA p95 ms | late chunks |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for run in range(1, args.runs + 1):
        for pattern in args.patterns.split(","):
            claim = int(httpx.get(f"{args.url}/v1/capacity", timeout=10).json()["max_streams"])
            options = ["--concurrency", str(3 * claim)]
            if pattern.endswith("x") and pattern[:-1].isdigit():
                options = ["--concurrency", str(int(pattern[:-1]) * claim)]
            elif pattern == "poisson3x":
                rate = 3 * claim / mean_audio_s
                options += ["--arrival", "poisson", "--rate", f"{rate:.3f}"]
            elif pattern == "burst3x":
                options += ["--arrival", "burst"]
            out = args.out / f"{pattern}-{run}"
            subprocess.run(
                [sys.executable, "-m", "cadenza", "loadtest", "--url", args.url, "--quiet",
                 "--duration", str(args.duration), "--out", str(out), *options],
                check=True, capture_output=True,
            )  # fmt: skip
            level = json.loads((out / "report.json").read_text())["levels"][0]
            ttfa = level["ttfa_admitted_ms"]["p95"]
            print(
                f"| {pattern} | {run} | {claim} | {level['offered']} | {level['admitted']} "
                f"| {level['queued']} | {level['rejected']} | {level['c100']} | {ttfa} "
                f"| {level['server'].get('late_chunks')} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
