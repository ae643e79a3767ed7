"""Command line: ``cadenza serve`` and ``cadenza generate`` (also ``python -m cadenza``)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from cadenza.config import CadenzaConfig, ConfigError, config_reference, load_config

_CONFIG_HELP = f"""\
configuration (flags > CADENZA_* environment > --config TOML file > defaults; a TOML file
uses the same sections, e.g. [server] port = 8001):
{config_reference()}
"""


def main(argv: list[str] | None = None) -> int:
    parser = _build_parser()
    args = parser.parse_args(argv)
    try:
        config = load_config(args.config, _overrides(args))
    except ConfigError as exc:
        print(f"cadenza: {exc}", file=sys.stderr)
        return 2
    handler = {"serve": _serve, "generate": _generate, "bench": _bench}[args.command]
    return handler(config, args)


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="cadenza", description="Real-time streaming speech/audio generation server."
    )
    commands = parser.add_subparsers(dest="command", required=True)

    serve = commands.add_parser(
        "serve",
        help="run the HTTP server (engine in its own process)",
        epilog=_CONFIG_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    serve.add_argument("--host", help="bind address (default 127.0.0.1)")
    serve.add_argument("--port", type=int, help="TCP port (default 8000)")
    _add_model_flags(serve)

    generate = commands.add_parser(
        "generate",
        help="synthesize one utterance offline into a WAV file",
        epilog=_CONFIG_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    generate.add_argument("--text", required=True, help="the text to speak")
    generate.add_argument("--out", required=True, type=Path, help="output WAV path")
    generate.add_argument("--voice", default="default")
    generate.add_argument("--seed", type=int, help="sampling seed (same seed, same audio)")
    generate.add_argument("--max-duration-s", type=float, help="cap on the audio length")
    _add_model_flags(generate)

    bench = commands.add_parser("bench", help="benchmarks, side by side in one run")
    bench.add_argument("target", choices=["engine", "codec"], help="what to measure")
    bench.add_argument("--json", action="store_true", help="print only the JSON result")
    bench.add_argument(
        "--batch-sizes",
        help="comma-separated batch sizes (engine: 1,4,16) or stream counts (codec: 1,4,8,16)",
    )
    bench.add_argument("--repeats", type=int, default=3, help="runs per measurement (median)")
    bench.add_argument("--config", type=Path, help=argparse.SUPPRESS)
    return parser


def _add_model_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", help="built-in model name or checkpoint directory")
    parser.add_argument("--device", choices=["auto", "cpu", "cuda"])
    parser.add_argument("--config", type=Path, help="TOML configuration file")


def _overrides(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "server": {"host": getattr(args, "host", None), "port": getattr(args, "port", None)},
        "model": {"name": getattr(args, "model", None), "device": getattr(args, "device", None)},
    }


def _serve(config: CadenzaConfig, _: argparse.Namespace) -> int:
    import uvicorn

    from cadenza.stream.app import create_app
    from cadenza.telemetry import configure_logging

    configure_logging(config.server.log_level, process="edge")
    uvicorn.run(
        create_app(config),
        host=config.server.host,
        port=config.server.port,
        log_level=config.server.log_level,
        timeout_graceful_shutdown=5,
    )
    return 0


def _generate(config: CadenzaConfig, args: argparse.Namespace) -> int:
    from cadenza.admission.validation import InvalidRequest, validate_synthesis
    from cadenza.codecs.wav import wav_file_bytes
    from cadenza.engine.engine import Engine
    from cadenza.engine.models.checkpoint import CheckpointError
    from cadenza.engine.models.registry import UnknownModelError
    from cadenza.engine.sampling_params import SamplingParams

    started = time.perf_counter()
    try:
        engine = Engine.from_config(config)
        validate_synthesis(
            model=config.model.name,
            text=args.text,
            voice=args.voice,
            max_duration_s=args.max_duration_s,
            served_model=engine.model_name,
            voices=engine.voices,
            limits=config.limits,
        )
    except (UnknownModelError, CheckpointError, InvalidRequest, ValueError) as exc:
        print(f"cadenza: {exc}", file=sys.stderr)
        return 2
    loaded = time.perf_counter()
    audio = engine.synthesize(
        args.text,
        voice=args.voice,
        max_duration_s=args.max_duration_s,
        sampling=SamplingParams(seed=args.seed),
    )
    done = time.perf_counter()
    args.out.write_bytes(wav_file_bytes(audio, engine.sample_rate))
    summary = {
        "out": str(args.out),
        "audio_s": round(len(audio) / engine.sample_rate, 3),
        "load_s": round(loaded - started, 3),
        "synthesis_s": round(done - loaded, 3),
    }
    print(json.dumps(summary))
    return 0


def _bench(_: CadenzaConfig, args: argparse.Namespace) -> int:
    from cadenza.bench import codec_throughput, engine_throughput

    default = "1,4,16" if args.target == "engine" else "1,4,8,16"
    try:
        sizes = tuple(int(b) for b in (args.batch_sizes or default).split(","))
    except ValueError:
        print(f"cadenza: --batch-sizes must be integers, got {args.batch_sizes!r}", file=sys.stderr)
        return 2
    if not sizes or min(sizes) < 1 or args.repeats < 1:
        print("cadenza: batch sizes and --repeats must be positive", file=sys.stderr)
        return 2
    runner = engine_throughput.run if args.target == "engine" else codec_throughput.run
    result = runner(sizes, repeats=args.repeats, progress=not args.json)
    print(json.dumps(result, indent=None if args.json else 2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
