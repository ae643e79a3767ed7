"""The claim heals: a server's capacity claim after a slowdown has passed, measured with real
clients (docs/capacity.md, "Recovery").

Each scenario starts its own ``cadenza serve`` (``--replicas``, the calibrations of the
user's cache copied into a scratch cache directory, so nothing of the user's is changed) and
drives bursts of short realtime utterances through the SDK while it polls ``/v1/capacity``:

The calibrations a scenario's servers measure are kept in the user's cache afterwards, as a
server would have kept them.

* ``hiccup``: idle, then ``--busy-s`` seconds in which ``--busy-procs`` busy-loop processes
  take the cores while a burst of ``--busy-burst`` arrives every ``--every`` seconds (the
  first ``--lead-s`` after the loops start: streams admitted before a slowdown begins are
  another scenario, which no admission can protect), then
  ``--quiet-s`` seconds of quiet with a burst of a quarter of the idle claim every
  ``--every`` seconds. Reports when the claim is back to 0.7 of the idle claim and the first
  burst admitted in full, counted from the end of the load.
* ``restart``: the factor file says ``--remembered`` (20) for every replica; the server
  starts from it, and a burst of a quarter of the claim it shows arrives every ``--every``
  seconds for ``--quiet-s`` seconds, then as many at once as ``available_now`` says. Reports
  when the claim reaches 0.7 of the idle claim (the same server's, with nothing remembered),
  counted from ready.
* ``calibrate``: a server's first start (an empty calibration cache) on a quiet machine, then
  again while ``--busy-procs`` busy loops run: whether the busy one agreed with itself, how
  many sweeps it took, whether it was cached, and each point against the quiet one.
* ``mix``: on an idle server, nine listeners at once (three short prompts, six of about
  1,000 characters), then the three short ones with ``--misbehaving`` clients' 4,000-character
  prompts arriving alongside; ``--rounds`` times each.

Every admitted stream is played out as the load tester plays it (100 ms client buffer), so
C100 (no underrun of 100 ms or more) is the share of admitted streams heard whole.

    .venv/bin/python benchmarks/capacity_recovery.py hiccup --replicas 1 --out /tmp/heal-1
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from cadenza.client import connect
from cadenza.loadtest.clients import ws_stream
from cadenza.loadtest.level_summary import StreamResult, share_under
from cadenza.loadtest.workload import LoadOptions

SHORT = "Short words arrive and leave again."  # about 2.5 s of audio
BUSY_LOOP = "while True: pass"
MAX_AUDIO_S = 4.0  # a long prompt asks for its prefill, not minutes of audio


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Server:
    """``cadenza serve`` on a free port with a scratch copy of the calibration cache."""

    def __init__(self, replicas: int, cache: Path, log: Path) -> None:
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {
            **os.environ,
            "CADENZA_CALIBRATION__CACHE_DIR": str(cache),
            "CADENZA_SUPERVISION__REPLICAS": str(replicas),
        }
        self._log = log.open("ab")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "cadenza", "serve", "--port", str(self.port)],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=env,
        )
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.url}/readyz", timeout=1).status_code == 200:
                    self.ready_at = time.monotonic()
                    return
            if self.process.poll() is not None:
                raise RuntimeError(f"server exited: see {log}")
            time.sleep(0.2)
        raise RuntimeError(f"server not ready: see {log}")

    def capacity(self) -> dict[str, Any]:
        return httpx.get(f"{self.url}/v1/capacity", timeout=5).json()

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
        self._log.close()


async def _one(url: str, text: str, seed: int, start: float) -> StreamResult:
    options = LoadOptions(url=url, max_duration_s=MAX_AUDIO_S)
    try:
        async with connect(options.ws_url) as session:
            return await ws_stream(session, text, options, start, seed)
    except OSError as exc:
        return StreamResult("error", time.monotonic() - start, reason=type(exc).__name__)


async def _burst(url: str, texts: list[str], start: float) -> list[StreamResult]:
    seed = int(1000 * (time.monotonic() - start))
    return list(await asyncio.gather(*(_one(url, t, seed + k, start) for k, t in enumerate(texts))))


def _burst_row(at_s: float, phase: str, results: list[StreamResult]) -> dict[str, Any]:
    reasons: dict[str, int] = {}
    for result in results:
        if not result.admitted:
            key = result.reason or result.outcome
            reasons[key] = reasons.get(key, 0) + 1
    return {
        "at_s": round(at_s, 1),
        "phase": phase,
        "size": len(results),
        "admitted": sum(r.admitted for r in results),
        "refused": reasons,
        "c100": share_under(results, 0.1),
        "ttfa_p95_ms": _p95([r.ttfa_s for r in results if r.ttfa_s is not None]),
    }


def _p95(values: list[float]) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(1000.0 * ordered[max(int(0.95 * len(ordered) + 0.5) - 1, 0)], 1)


async def _poll(
    server: Server, start: float, timeline: list[dict[str, Any]], stop: asyncio.Event
) -> None:
    async with httpx.AsyncClient(timeout=5) as client:
        while not stop.is_set():
            with contextlib.suppress(httpx.HTTPError):
                body = (await client.get(f"{server.url}/v1/capacity")).json()
                timeline.append(
                    {
                        "t_s": round(time.monotonic() - start, 2),
                        "max_streams": body["max_streams"],
                        "available_now": body["available_now"],
                        "evidence": body["claim"]["evidence"],
                        "factor": body["realtime_factor"],
                        "probes": body["probes"],
                    }
                )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.5)


def _first(timeline: list[dict[str, Any]], after_s: float, claim: int) -> float | None:
    for point in timeline:
        if point["t_s"] >= after_s and point["max_streams"] >= claim:
            return round(point["t_s"] - after_s, 1)
    return None


async def hiccup(server: Server, args: argparse.Namespace) -> dict[str, Any]:
    await asyncio.sleep(3.0)
    idle_claim = server.capacity()["max_streams"]
    quiet_burst = max(idle_claim // 4, 1)
    timeline: list[dict[str, Any]] = []
    bursts: list[dict[str, Any]] = []
    stop = asyncio.Event()
    start = time.monotonic()
    poller = asyncio.create_task(_poll(server, start, timeline, stop))
    busy = [subprocess.Popen([sys.executable, "-c", BUSY_LOOP]) for _ in range(args.busy_procs)]
    pending: list[asyncio.Task[None]] = []

    async def fire(at_s: float, phase: str, size: int) -> None:
        results = await _burst(server.url, [SHORT] * size, start)
        bursts.append(_burst_row(at_s, phase, results))

    async def end_load() -> None:
        await asyncio.sleep(max(start + args.busy_s - time.monotonic(), 0.0))
        for process in busy:
            process.kill()

    pending.append(asyncio.create_task(end_load()))
    try:
        at_s = args.lead_s
        while at_s < args.busy_s + args.quiet_s:
            await asyncio.sleep(max(start + at_s - time.monotonic(), 0.0))
            phase = "busy" if at_s < args.busy_s else "quiet"
            size = args.busy_burst if phase == "busy" else quiet_burst
            pending.append(asyncio.create_task(fire(at_s, phase, size)))
            at_s += args.every
        await asyncio.gather(*pending)
    finally:
        for process in busy:
            process.kill()
        stop.set()
        await poller
    bursts.sort(key=lambda b: b["at_s"])
    full = next(
        (b["at_s"] for b in bursts if b["phase"] == "quiet" and b["admitted"] == b["size"]), None
    )
    admitted = [b for b in bursts if b["admitted"]]
    return {
        "scenario": "hiccup",
        "replicas": args.replicas,
        "idle_claim": idle_claim,
        "quiet_burst": quiet_burst,
        "claim_back_after_s": _first(timeline, args.busy_s, int(0.7 * idle_claim + 0.999)),
        "full_burst_after_s": None if full is None else round(full - args.busy_s, 1),
        "lowest_claim": min((p["max_streams"] for p in timeline), default=None),
        "c100_min": min((b["c100"] for b in admitted if b["c100"] is not None), default=None),
        "bursts": bursts,
        "timeline": timeline,
        **_holds(server),
    }


async def restart(server: Server, args: argparse.Namespace, idle_claim: int) -> dict[str, Any]:
    start = server.ready_at
    timeline: list[dict[str, Any]] = []
    bursts: list[dict[str, Any]] = []
    stop = asyncio.Event()
    poller = asyncio.create_task(_poll(server, start, timeline, stop))
    try:
        at_s = 0.0
        while at_s < args.quiet_s:
            await asyncio.sleep(max(start + at_s - time.monotonic(), 0.0))
            claimed = server.capacity()["max_streams"]
            size = max(claimed // 4, 1)
            results = await _burst(server.url, [SHORT] * size, start)
            bursts.append({**_burst_row(at_s, "after ready", results), "claimed": claimed})
            at_s += args.every
        # Admits what it claims: as many at once as /v1/capacity says would start now.
        await asyncio.sleep(3.0)
        available = server.capacity()["available_now"]
        results = await _burst(server.url, [SHORT] * available, start)
        row = _burst_row(time.monotonic() - start, "available_now at once", results)
        bursts.append({**row, "claimed": available})
    finally:
        stop.set()
        await poller
    return {
        "scenario": "restart",
        "replicas": args.replicas,
        "remembered": args.remembered,
        "idle_claim": idle_claim,
        "first_claim": timeline[0]["max_streams"] if timeline else None,
        "claim_back_after_s": _first(timeline, 0.0, int(0.7 * idle_claim + 0.999)),
        "bursts": bursts,
        "timeline": timeline,
    }


async def mix(server: Server, args: argparse.Namespace) -> dict[str, Any]:
    start = time.monotonic()
    rounds = []
    for number in range(args.rounds):
        # every text its own from its first word: no prefix-cache hit across rounds or clients
        short = [f"{number}-{k}. {SHORT}" for k in range(3)]
        long = [
            (f"{number}-{k}. " + "a long paragraph of words to speak " * 30)[:1000]
            for k in range(6)
        ]
        hostile = [
            (f"{number}-{k}. Misbehaving " + "x" * 4100)[:4000] for k in range(args.misbehaving)
        ]
        await asyncio.sleep(3.0)
        before = server.capacity()
        results = await _burst(server.url, short + long, start)
        row = _burst_row(time.monotonic() - start, "3 short + 6 long", results)
        rounds.append({**row, "claim": before["max_streams"], "factor": before["realtime_factor"]})
        await asyncio.sleep(3.0)
        short = [f"{number}-{k}. again {SHORT}" for k in range(3)]
        before = server.capacity()
        results = await _burst(server.url, short + hostile, start)
        row = _burst_row(time.monotonic() - start, f"3 short + {args.misbehaving} x 4000", results)
        row.update(claim=before["max_streams"], factor=before["realtime_factor"])
        row["short_admitted"] = sum(r.admitted for r in results[:3])
        row["short_ttfa_p95_ms"] = _p95([r.ttfa_s for r in results[:3] if r.ttfa_s is not None])
        rounds.append(row)
    return {"scenario": "mix", "replicas": args.replicas, "rounds": rounds, **_holds(server)}


def calibrate(args: argparse.Namespace) -> dict[str, Any]:
    runs = {}
    for phase in ("quiet", "busy"):
        cache = Path(tempfile.mkdtemp(prefix="cadenza-calibrate-"))
        busy = []
        if phase == "busy":
            busy = [
                subprocess.Popen([sys.executable, "-c", BUSY_LOOP]) for _ in range(args.busy_procs)
            ]
        try:
            server = Server(args.replicas, cache, args.out / f"server-{phase}.log")
            ready = httpx.get(f"{server.url}/readyz", timeout=5).json()
            calibration = server.capacity()["calibration"]
            server.stop()
        finally:
            for process in busy:
                process.kill()
        runs[phase] = {
            "points": {str(t): round(ms, 3) for t, _, ms in calibration["model"]["decode_points"]},
            "attempts": calibration["attempts"],
            "problems": calibration["problems"],
            "cached": bool(list(cache.glob("calibration-*.json"))),
            "readyz": ready["models"],
        }
        shutil.rmtree(cache, ignore_errors=True)
    quiet, busy_run = runs["quiet"]["points"], runs["busy"]["points"]
    runs["busy_over_quiet"] = {t: round(busy_run[t] / quiet[t], 3) for t in quiet if t in busy_run}
    return {"scenario": "calibrate", "replicas": args.replicas, **runs}


def _holds(server: Server) -> dict[str, Any]:
    """What held streams that could not start at once, by reason (the server's metrics)."""
    holds: dict[str, float] = {}
    for line in httpx.get(f"{server.url}/metrics", timeout=5).text.splitlines():
        if line.startswith("cadenza_admission_holds_total{"):
            reason = line.split('reason="')[1].split('"')[0]
            holds[reason] = holds.get(reason, 0.0) + float(line.rsplit(" ", 1)[1])
    return {"holds": holds}


def _remember(cache: Path, server: Server, replicas: int, factor: float) -> None:
    identity = server.capacity()["calibration"]["identity"]
    entries = {
        f"{identity}/{replicas}/{i}": {"factor": factor, "at": time.time()} for i in range(replicas)
    }
    (cache / "realtime-factors.json").write_text(json.dumps(entries))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("scenario", choices=("hiccup", "restart", "mix", "calibrate"))
    parser.add_argument("--replicas", type=int, default=1)
    parser.add_argument("--busy-s", type=float, default=20.0)
    parser.add_argument("--quiet-s", type=float, default=40.0)
    parser.add_argument("--every", type=float, default=4.0)
    parser.add_argument("--busy-burst", type=int, default=6)
    parser.add_argument("--lead-s", type=float, default=2.0)
    parser.add_argument("--busy-procs", type=int, default=2)
    parser.add_argument("--remembered", type=float, default=20.0)
    parser.add_argument("--misbehaving", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    user_cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "cadenza"
    cache = Path(tempfile.mkdtemp(prefix="cadenza-recovery-"))
    for calibration in user_cache.glob("calibration-*.json"):
        shutil.copy(calibration, cache)
    log = args.out / "server.log"
    if args.scenario == "calibrate":
        result = calibrate(args)
        (args.out / "result.json").write_text(json.dumps(result, indent=1))
        print(json.dumps(result))
        return
    try:
        server = Server(args.replicas, cache, log)
        try:
            if args.scenario == "hiccup":
                result = asyncio.run(hiccup(server, args))
            elif args.scenario == "mix":
                result = asyncio.run(mix(server, args))
            else:
                time.sleep(3.0)
                idle_claim = server.capacity()["max_streams"]
                _remember(cache, server, args.replicas, args.remembered)
                server.stop()
                server = Server(args.replicas, cache, log)
                result = asyncio.run(restart(server, args, idle_claim))
        finally:
            server.stop()
    finally:
        for calibration in cache.glob("calibration-*.json"):  # what a server would have kept
            if not (user_cache / calibration.name).exists():
                shutil.copy(calibration, user_cache)
        shutil.rmtree(cache, ignore_errors=True)
    (args.out / "result.json").write_text(json.dumps(result, indent=1))
    summary = {k: v for k, v in result.items() if k not in ("timeline", "bursts")}
    print(json.dumps(summary))
    for row in result.get("bursts", result.get("rounds", [])):
        print(json.dumps(row))


if __name__ == "__main__":
    main()
