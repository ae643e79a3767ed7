"""``cadenza bench``: the benchmarks of ``cadenza/bench/``, side by side in one run."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cadenza.config import CadenzaConfig


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    bench = commands.add_parser("bench", help="benchmarks, side by side in one run")
    bench.add_argument(
        "target",
        choices=["engine", "codec", "snac", "precision", "pacing", "csm", "bark", "dia", "pocket"],
        help="what to measure",
    )
    bench.add_argument("--url", default="http://127.0.0.1:8000", help="server (pacing)")
    bench.add_argument("--peers", type=int, default=8, help="WebRTC peers at once (pacing)")
    bench.add_argument("--seconds", type=float, default=10.0, help="audio per peer (pacing)")
    bench.add_argument("--json", action="store_true", help="print only the JSON result")
    bench.add_argument(
        "--batch-sizes",
        help="comma-separated batch sizes (engine: 1,4,16), stream counts (codec: 1,4,8,16) "
        "or rows of the linear products (precision: 1,16,32)",
    )
    bench.add_argument("--repeats", type=int, default=3, help="runs per measurement (median)")
    bench.add_argument(
        "--shape",
        choices=[
            "csm-small",
            "csm-1b",
            "bark-small",
            "bark-tiny",
            "dia-small",
            "dia-1.6b",
            "dia-tiny",
            "pocket",
            "pocket-tiny",
        ],
        help="the model's size; csm: csm-small (default) or csm-1b (the public model's); "
        "bark: bark-small (default, the public model's) or bark-tiny (a smoke run); "
        "dia: dia-small (default), dia-1.6b (the public model's) or dia-tiny (a smoke run); "
        "pocket: pocket (default, the public model's) or pocket-tiny (a smoke run)",
    )
    bench.add_argument(
        "--semantic-tokens",
        type=int,
        default=100,
        help="bark: semantic tokens per stream (100: about 2 s of audio)",
    )
    bench.add_argument(
        "--dtype",
        choices=["float32", "auto"],
        default="float32",
        help="engine: cadenza's dtype (float32, the reference's own precision; auto: the "
        "engine's choice, bf16 products on a CPU with native bf16)",
    )
    bench.add_argument(
        "--save-checkpoint",
        type=Path,
        metavar="DIR",
        help="pocket: write the benchmarked checkpoint into DIR and keep it (to serve and "
        "sweep the same model)",
    )
    bench.add_argument("--config", type=Path, help=argparse.SUPPRESS)
    bench.set_defaults(run=run)


def run(_: CadenzaConfig, args: argparse.Namespace) -> int:
    from cadenza.bench import (
        codec_throughput,
        cpu_precision,
        csm_throughput,
        dia_throughput,
        engine_throughput,
        pocket_throughput,
        snac_throughput,
    )

    if args.target == "pacing":
        from cadenza.bench import pacing

        print(json.dumps(pacing.run(args.url, args.peers, args.seconds)))
        return 0

    default = {
        "engine": "1,4,16",
        "snac": "1,4,8",
        "precision": "1,16,32",
        "csm": "1,4,8",
        "bark": "1,4,8",
        "dia": "1,4,8",
        "pocket": "1,4,8,16",
    }.get(args.target, "1,4,8,16")
    try:
        sizes = tuple(int(b) for b in (args.batch_sizes or default).split(","))
    except ValueError:
        print(f"cadenza: --batch-sizes must be integers, got {args.batch_sizes!r}", file=sys.stderr)
        return 2
    if not sizes or min(sizes) < 1 or args.repeats < 1:
        print("cadenza: batch sizes and --repeats must be positive", file=sys.stderr)
        return 2
    # The benchmarks of a model in one of its shapes (--shape), the default shape first.
    model_shapes = {
        "csm": ("csm-small", "csm-1b"),
        "bark": ("bark-small", "bark-tiny"),
        "dia": ("dia-small", "dia-1.6b", "dia-tiny"),
        "pocket": ("pocket", "pocket-tiny"),
    }
    shapes: tuple[str, ...] = model_shapes.get(args.target, ())
    shape: str = args.shape or (shapes[0] if shapes else "")
    if shapes and shape not in shapes:
        print(f"cadenza: --shape {shape} is not a {args.target} shape", file=sys.stderr)
        return 2
    if args.save_checkpoint is not None and args.target != "pocket":
        print("cadenza: --save-checkpoint is for the pocket benchmark", file=sys.stderr)
        return 2
    if not 1 <= args.semantic_tokens <= 768:
        print("cadenza: --semantic-tokens must be in 1..768", file=sys.stderr)
        return 2
    from cadenza.bench import bark_throughput

    runners: dict[str, Callable[..., dict[str, Any]]] = {
        "engine": engine_throughput.run,
        "codec": codec_throughput.run,
        "snac": snac_throughput.run,
        "precision": cpu_precision.run,
        "csm": csm_throughput.run,
        "dia": dia_throughput.run,
        "bark": bark_throughput.run,
        "pocket": pocket_throughput.run,
    }
    options = {
        "engine": {"dtype": args.dtype},
        "csm": {"shape": shape},
        "dia": {"shape": shape},
        "pocket": {"shape": shape, "checkpoint": args.save_checkpoint},
        "bark": {"shape": shape, "semantic_tokens": args.semantic_tokens},
    }
    result = runners[args.target](
        sizes, repeats=args.repeats, progress=not args.json, **options.get(args.target, {})
    )
    print(json.dumps(result, indent=None if args.json else 2))
    return 0
