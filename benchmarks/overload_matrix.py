"""Run ``cadenza loadtest`` in every arrival pattern the on-time guarantee covers, several
times, and print one table row per run (docs/benchmarks.md).

Patterns, each relative to the server's own claim ``N`` (``/v1/capacity`` ``max_streams``,
read before every run): closed loop at N, 2N and 3N streams; Poisson arrivals at three times
the rate N streams of the mean utterance need; and a burst of 3N streams opened at once.

Against a running server::

    .venv/bin/python benchmarks/overload_matrix.py --url http://127.0.0.1:8000 --runs 5 \\
        --duration 20 --out /tmp/matrix

From a fresh start each time (``--fresh``): the script starts ``cadenza serve`` itself before
every run, with an empty calibration cache (a new calibration, nothing remembered), and stops
it after; ``--isa`` (``CADENZA_NATIVE_ISA``), ``--threads`` (``model.torch_threads``) and
``--replicas`` run it as another CPU would, where the machine allows::

    .venv/bin/python benchmarks/overload_matrix.py --fresh --runs 5 \\
        --patterns 3x,poisson3x,burst3x --isa x86-64-v3 --out /tmp/matrix-avx2
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

TEXT = (40, 120)  # the harness's default text lengths
CHARS_PER_SECOND = 14.0  # the server's default limits.chars_per_second


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def fresh_server(args: argparse.Namespace, log: Path) -> Iterator[str]:
    """``cadenza serve`` on a free port with an empty calibration cache; its URL once ready."""
    port = _free_port()
    with tempfile.TemporaryDirectory(prefix="cadenza-matrix-") as cache:
        env = {**os.environ, "CADENZA_CALIBRATION__CACHE_DIR": cache}
        if args.isa:
            env["CADENZA_NATIVE_ISA"] = args.isa
        if args.threads:
            env["CADENZA_MODEL__TORCH_THREADS"] = str(args.threads)
        if args.replicas:
            env["CADENZA_SUPERVISION__REPLICAS"] = str(args.replicas)
        with log.open("ab") as sink:
            process = subprocess.Popen(
                [sys.executable, "-m", "cadenza", "serve", "--port", str(port)],
                stdout=sink, stderr=subprocess.STDOUT, env=env,
            )  # fmt: skip
            url = f"http://127.0.0.1:{port}"
            try:
                deadline = time.monotonic() + 900
                while time.monotonic() < deadline:
                    with contextlib.suppress(httpx.HTTPError):
                        if httpx.get(f"{url}/readyz", timeout=1).status_code == 200:
                            break
                    if process.poll() is not None:
                        raise RuntimeError(f"server exited: see {log}")
                    time.sleep(0.5)
                else:
                    raise RuntimeError(f"server not ready: see {log}")
                yield url
            finally:
                process.terminate()
                try:
                    process.wait(30)
                except subprocess.TimeoutExpired:
                    process.kill()


def run_pattern(url: str, pattern: str, run: int, args: argparse.Namespace) -> str:
    """One loadtest run of ``pattern`` against ``url``; its table row."""
    mean_audio_s = sum(TEXT) / 2 / CHARS_PER_SECOND
    capacity = httpx.get(f"{url}/v1/capacity", timeout=10).json()
    claim = int(capacity["max_streams"])
    wave = capacity["limits"].get("arrival_wave")
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
        [sys.executable, "-m", "cadenza", "loadtest", "--url", url, "--quiet",
         "--duration", str(args.duration), "--out", str(out), *options],
        check=True, capture_output=True,
    )  # fmt: skip
    level = json.loads((out / "report.json").read_text())["levels"][0]
    ttfa = level["ttfa_admitted_ms"]["p95"]
    return (
        f"| {pattern} | {run} | {claim} | {wave} | {level['offered']} | {level['admitted']} "
        f"| {level['queued']} | {level['rejected']} | {level['c100']} | {ttfa} "
        f"| {level['server'].get('late_chunks')} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--duration", type=float, default=20.0)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--patterns", default="1x,2x,3x,poisson3x,burst3x")
    parser.add_argument(
        "--fresh", action="store_true", help="start a server with a new calibration per run"
    )
    parser.add_argument("--isa", default="", help="CADENZA_NATIVE_ISA for --fresh servers")
    parser.add_argument("--threads", type=int, default=0, help="model.torch_threads (--fresh)")
    parser.add_argument(
        "--replicas", type=int, default=0, help="supervision.replicas (--fresh; 0: default)"
    )
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    print(
        "| pattern | run | claim N | arriving at once | offered | admitted | queued | refused "
        "| admitted C100 | admitted TTFA p95 ms | late chunks |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for run in range(1, args.runs + 1):
        for pattern in args.patterns.split(","):
            if args.fresh:
                with fresh_server(args, args.out / f"serve-{pattern}-{run}.log") as url:
                    print(run_pattern(url, pattern, run, args), flush=True)
            else:
                print(run_pattern(args.url, pattern, run, args), flush=True)


if __name__ == "__main__":
    main()
