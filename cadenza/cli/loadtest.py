"""``cadenza loadtest``: real clients against a running server, and the concurrent streams it
holds at the SLO (docs/loadtest.md)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from cadenza.config import CadenzaConfig


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    loadtest = commands.add_parser(
        "loadtest",
        help="drive real clients against a server and report concurrent streams at SLO",
        description="Offer load to a running server, simulate each client's playout, and "
        "report TTFA, underruns (C50/C100/C200) and RTF per level; --sweep finds the most "
        "concurrent streams at SLO. Outputs report.json, report.md and PNG plots in --out.",
    )
    loadtest.add_argument("--url", required=True, help="server, e.g. http://127.0.0.1:8000")
    loadtest.add_argument("--transport", choices=["ws", "http", "webrtc"], default="ws")
    level_choice = loadtest.add_mutually_exclusive_group(required=True)
    level_choice.add_argument("--concurrency", type=int, help="run one level of N streams")
    level_choice.add_argument("--sweep", action="store_true", help="find capacity at SLO")
    loadtest.add_argument("--arrival", choices=["closed", "poisson", "burst"], default="closed")
    loadtest.add_argument(
        "--back-to-back",
        action="store_true",
        help="closed: each user's next utterance as soon as the last chunk arrives, not after "
        "it has been heard to its end",
    )
    loadtest.add_argument(
        "--ramp-s",
        type=float,
        default=0.25,
        help="closed: spread the users' first requests evenly over this many seconds",
    )
    loadtest.add_argument("--rate", type=float, default=1.0, help="poisson: streams per second")
    loadtest.add_argument("--duration", type=float, default=20.0, help="seconds per level")
    loadtest.add_argument(
        "--text-lengths", default="uniform:40-120", help="fixed:N or uniform:A-B characters"
    )
    loadtest.add_argument("--slo-ttfa-ms", type=float, default=500.0)
    loadtest.add_argument("--slo-underrun-ms", type=float, default=100.0)
    loadtest.add_argument("--client-buffer-ms", type=float, default=100.0)
    loadtest.add_argument(
        "--priority", choices=["realtime", "standard", "batch"], default="realtime"
    )
    loadtest.add_argument("--api-key")
    loadtest.add_argument("--model", help="the served model to load (default: the server's first)")
    loadtest.add_argument(
        "--voice", help="its voice (default: 'default' if it has one, else its first)"
    )
    loadtest.add_argument("--baseline", help="a second server to sweep the same way (naive)")
    loadtest.add_argument("--start", type=int, default=1, help="sweep: first level")
    loadtest.add_argument("--limit", type=int, default=128, help="sweep: largest level")
    loadtest.add_argument("--seed", type=int, default=0)
    loadtest.add_argument(
        "--chaos-kill-every",
        metavar="A-B",
        help="SIGKILL a random engine replica every A to B seconds (the server must run on "
        "this machine; its /admin/replicas gives the process ids)",
    )
    loadtest.add_argument(
        "--chaos-kill-nodes",
        metavar="PID,-PGID,...",
        help="with --chaos-kill-every: SIGKILL whole nodes of this list instead of engine "
        "replicas (a negative number is a process group: a node's edge and engines at once)",
    )
    loadtest.add_argument(
        "--text-stream",
        type=float,
        metavar="TOKENS_PER_S",
        help="ws: stream each utterance's text in (sentences, word pieces) at this many tokens "
        "per second, as a language model does; reports segment gaps and last text to end",
    )
    loadtest.add_argument("--out", required=True, type=Path, help="output directory")
    loadtest.add_argument("--quiet", action="store_true", help="no progress line")
    loadtest.add_argument("--config", type=Path, help=argparse.SUPPRESS)
    loadtest.set_defaults(run=run)


def run(_: CadenzaConfig, args: argparse.Namespace) -> int:
    import asyncio

    from cadenza.gc_pauses import freeze_loaded_heap
    from cadenza.loadtest.chaos import ChaosSchedule
    from cadenza.loadtest.harness import LoadTestError, run_loadtest
    from cadenza.loadtest.workload import LoadOptions, TextLengths, WorkloadError

    try:
        for name, value in (
            ("--concurrency", args.concurrency),
            ("--start", args.start),
            ("--limit", args.limit),
        ):
            if value is not None and value < 1:
                raise WorkloadError(f"{name} must be at least 1, got {value}")
        if args.start > args.limit:
            raise WorkloadError(f"--start {args.start} is above --limit {args.limit}")
        options = LoadOptions(
            url=args.url.rstrip("/"),
            transport=args.transport,
            arrival=args.arrival,
            rate=args.rate,
            duration_s=args.duration,
            text_lengths=TextLengths.parse(args.text_lengths),
            slo_ttfa_ms=args.slo_ttfa_ms,
            slo_underrun_ms=args.slo_underrun_ms,
            client_buffer_ms=args.client_buffer_ms,
            priority=args.priority,
            api_key=args.api_key,
            seed=args.seed,
            model=args.model,
            voice=args.voice,
            back_to_back=args.back_to_back,
            ramp_s=args.ramp_s,
            text_stream_tokens_per_s=args.text_stream,
            chaos=None
            if args.chaos_kill_every is None
            else ChaosSchedule.parse(args.chaos_kill_every, args.chaos_kill_nodes),
        )
        # The clients' own arrival times are the measurement: a full collection of this
        # process would show up as a gap in every stream's audio that the server never made
        # (each level also puts them off to its end: run_level).
        freeze_loaded_heap()
        report, paths = asyncio.run(
            run_loadtest(
                options,
                out_dir=args.out,
                concurrency=args.concurrency,
                baseline_url=args.baseline,
                start=args.start,
                limit=args.limit,
                progress=None if args.quiet else _progress_line,
            )
        )
    except (WorkloadError, LoadTestError) as exc:
        print(f"cadenza loadtest: {exc}", file=sys.stderr)
        return 2
    print(file=sys.stderr)
    summary = {
        "capacity_streams": report["capacity_streams"],
        "ideal_streams": report["ideal_streams"],
        "realtime_bound_streams": report["realtime_bound_streams"],
        "server_max_streams": report["server_max_streams"],
        "server_max_streams_after": report["server_max_streams_after"],
        "baseline_capacity_streams": (report.get("baseline") or {}).get("capacity_streams"),
        "outputs": [str(p) for p in paths],
    }
    print(json.dumps(summary, indent=1))
    return 0


def _progress_line(text: str) -> None:
    print(f"\r{text}", end="", file=sys.stderr, flush=True)
