"""Bark's first audio for a text of three sentences on two source trees, the two servers one
after the other, ``--rounds`` times alternated: ``--before`` (an older commit) and this tree,
which speaks a long text sentence by sentence. ``--before-speaks whole``: the older tree speaks
the text as one generation (a commit before sentence by sentence); ``sentences``: it too
speaks it sentence by sentence (comparing engines).

A random Bark never ends a sentence by itself, so each generation runs to its
``max_duration_s``: a server speaking the text as one generation gets ``3 x --sentence-s`` for
the whole text, one speaking it sentence by sentence ``--sentence-s`` per sentence, the same
audio in all, as a real Bark speaking each sentence in that time would. Reported per server:
the time from ``speak`` to the first audio frame over WebSocket (median and each run), and the
whole stream's time.

    git worktree add /tmp/before 4b338c5
    .venv/bin/python benchmarks/bark_sentences_ttfa.py --before /tmp/before --rounds 3

Starts its own servers (calibration off: admission by memory only) on a random bark-tiny
(``--shape``) saved under ``--out``; writes ``summary.json`` there.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from cadenza.bench.random_bark import save_random_bark
from cadenza.client import connect

TEXT = (
    "Bark speaks this first sentence in its own voice. "
    "Then it goes on with a second one, a little longer than the first. "
    "And it ends with a third."
)
VOICE = "v2/en_speaker_6"


def serve(source: Path, model: Path, port: int, log: Path) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "PYTHONPATH": str(source),
        "CADENZA_CALIBRATION__MODE": "off",
        "CADENZA_ADMISSION__SLACK_CLOSE_MS": "-1e9",
    }
    command = [sys.executable, "-m", "cadenza", "serve", "--model", str(model)]
    command += ["--port", str(port), "--replicas", "1"]
    return subprocess.Popen(
        command, stdout=log.open("ab"), stderr=subprocess.STDOUT, env=env, cwd=source
    )


def wait_ready(url: str, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError("the server exited; see its log")
        try:
            if httpx.get(f"{url}/readyz", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise RuntimeError("the server did not become ready")


async def one_stream(url: str, max_duration_s: float) -> tuple[float, float]:
    """Seconds from ``speak`` to the first audio frame, and to the stream's end."""
    async with connect(url.replace("http", "ws") + "/v1/stream") as session:
        started = time.perf_counter()
        first = None
        async for _ in session.speak(
            TEXT, voice=VOICE, max_duration_s=max_duration_s, temperature=0.0
        ):
            if first is None:
                first = time.perf_counter() - started
        assert first is not None, "no audio"
        return first, time.perf_counter() - started


def measure(source: Path, model: Path, max_duration_s: float, out: Path) -> dict[str, float]:
    port = 18000 + os.getpid() % 1000
    url = f"http://127.0.0.1:{port}"
    process = serve(source, model, port, out / "server.log")
    try:
        wait_ready(url, process)
        asyncio.run(one_stream(url, max_duration_s))  # warm: first steps allocate
        first, total = asyncio.run(one_stream(url, max_duration_s))
        return {"first_audio_s": first, "stream_s": total}
    finally:
        process.terminate()
        process.wait(timeout=60)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", type=Path, required=True, help="the older source tree")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--sentence-s", type=float, default=2.0)
    parser.add_argument("--before-speaks", choices=["whole", "sentences"], default="whole")
    parser.add_argument("--shape", default="bark-tiny", choices=["bark-small", "bark-tiny"])
    parser.add_argument("--out", type=Path, default=Path(tempfile.mkdtemp(prefix="bark-ttfa-")))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    model = args.out / args.shape
    if not (model / "config.json").exists():
        save_random_bark(model, args.shape)
    here = Path(__file__).resolve().parents[1]
    runs: dict[str, list[dict[str, float]]] = {"before": [], "after": []}
    before_s = args.sentence_s * (3 if args.before_speaks == "whole" else 1)
    for _ in range(args.rounds):
        runs["before"].append(measure(args.before, model, before_s, args.out))
        runs["after"].append(measure(here, model, args.sentence_s, args.out))
        print(json.dumps({way: values[-1] for way, values in runs.items()}), flush=True)
    summary: dict[str, Any] = {
        "shape": args.shape,
        "before_speaks": args.before_speaks,
        "audio_s": 3 * args.sentence_s,
        "text": TEXT,
    }
    for way, values in runs.items():
        summary[way] = {
            "first_audio_s_median": statistics.median(v["first_audio_s"] for v in values),
            "stream_s_median": statistics.median(v["stream_s"] for v in values),
            "runs": values,
        }
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2))
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
