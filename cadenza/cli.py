"""Command line: ``cadenza serve | generate | plan | bench | loadtest`` (also
``python -m cadenza``)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
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
    handler = {
        "serve": _serve,
        "generate": _generate,
        "bench": _bench,
        "plan": _plan,
        "loadtest": _loadtest,
    }[args.command]
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
    serve.add_argument("--api-keys-file", help="accepted API keys, one per line (or sha256:<hex>)")
    serve.add_argument(
        "--engine",
        choices=["cadenza", "naive"],
        help="naive: one thread per request with the transformers model (a load-test baseline)",
    )
    serve.add_argument(
        "--engine-replicas",
        type=int,
        help="engine processes per model (default: one per core on a CPU-only machine with at "
        "most 2 cores, else 1; with several GPUs, one per device)",
    )
    serve.add_argument(
        "--warm-spare",
        action="store_true",
        default=None,
        help="keep a loaded engine per replica that replaces a lost one at once",
    )
    serve.add_argument(
        "--drain-timeout-s",
        type=float,
        help="on SIGTERM: how long open streams may run on before ending (default 30)",
    )
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
    generate.add_argument("--temperature", type=float, help="0: greedy (default: the model's)")
    generate.add_argument("--top-k", type=int, help="0: off (default: the model's)")
    generate.add_argument("--top-p", type=float, help="1: off (default: the model's)")
    generate.add_argument("--min-p", type=float, help="0: off (default: the model's)")
    generate.add_argument("--repetition-penalty", type=float, help="1: off (default: the model's)")
    generate.add_argument(
        "--codec-noise",
        choices=["on", "off"],
        help="SNAC's noise layers (off: the same tokens always give the same audio)",
    )
    _add_model_flags(generate)

    plan = commands.add_parser(
        "plan",
        help="KV memory per token and sequence, and how many sequences fit",
        description="KV cache arithmetic: 2 x layers x kv_heads x head_dim x bytes(kv_dtype) "
        "per token (+ one float16 scale per token, layer, head and K/V for int8). --model "
        "takes the shape from a built-in model or a checkpoint directory instead of the flags.",
    )
    plan.add_argument("--layers", type=int)
    plan.add_argument("--kv-heads", type=int)
    plan.add_argument("--head-dim", type=int)
    plan.add_argument("--heads", type=int, help="query heads, for the MHA-to-GQA comparison")
    plan.add_argument("--kv-dtype", choices=["fp32", "fp16", "bf16", "int8", "fp8"], default="bf16")
    plan.add_argument("--context", type=int, required=True, help="tokens per sequence")
    plan.add_argument("--batch", type=int, help="sequences that must fit at once")
    plan.add_argument("--memory", help="device memory, e.g. 80GiB, 24GB, 1e9")
    plan.add_argument("--weights-bytes", help="memory the weights take (subtracted), e.g. 16GiB")
    plan.add_argument("--model", help="built-in model name or checkpoint directory")
    plan.add_argument("--json", action="store_true", help="print JSON")
    plan.add_argument(
        "--no-measure",
        action="store_true",
        help="with --model: skip measuring the real-time capacity on this device",
    )
    plan.add_argument("--config", type=Path, help=argparse.SUPPRESS)

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
    loadtest.add_argument("--out", required=True, type=Path, help="output directory")
    loadtest.add_argument("--quiet", action="store_true", help="no progress line")
    loadtest.add_argument("--config", type=Path, help=argparse.SUPPRESS)

    bench = commands.add_parser("bench", help="benchmarks, side by side in one run")
    bench.add_argument(
        "target",
        choices=["engine", "codec", "snac", "precision", "pacing", "csm"],
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
        choices=["csm-small", "csm-1b"],
        default="csm-small",
        help="csm: the model's size (csm-1b: the public model's)",
    )
    bench.add_argument("--config", type=Path, help=argparse.SUPPRESS)
    return parser


def _add_model_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model", help="built-in model name, checkpoint directory or cached hub id"
    )
    parser.add_argument(
        "--codec", help="codec instead of the model's (encodec_24khz, snac_24khz, a directory)"
    )
    parser.add_argument("--device", choices=["auto", "cpu", "cuda"])
    parser.add_argument(
        "--kv-dtype",
        dest="engine_kv_dtype",
        choices=["auto", "fp32", "fp16", "bf16", "int8"],
        help="KV cache dtype (int8: per-token-per-head scales, ~2x the tokens of fp16)",
    )
    parser.add_argument(
        "--weights-dtype", choices=["auto", "int8"], help="int8: weight-only int8 linears"
    )
    parser.add_argument("--config", type=Path, help="TOML configuration file")


def _overrides(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "server": {
            "host": getattr(args, "host", None),
            "port": getattr(args, "port", None),
            "api_keys_file": getattr(args, "api_keys_file", None),
            "drain_timeout_s": getattr(args, "drain_timeout_s", None),
        },
        "model": {
            "name": getattr(args, "model", None),
            "codec": getattr(args, "codec", None),
            "codec_noise": None
            if getattr(args, "codec_noise", None) is None
            else args.codec_noise == "on",
            "device": getattr(args, "device", None),
            "weights_dtype": getattr(args, "weights_dtype", None),
        },
        "engine": {
            "kind": getattr(args, "engine", None),
            "kv_dtype": getattr(args, "engine_kv_dtype", None),
            "replicas": getattr(args, "engine_replicas", None),
            "warm_spare": getattr(args, "warm_spare", None),
        },
    }


def _serve(config: CadenzaConfig, _: argparse.Namespace) -> int:
    import uvicorn

    from cadenza.edge.admission.api_keys import ApiKeyFileError
    from cadenza.edge.admission.guard import GuardError
    from cadenza.edge.app import create_app
    from cadenza.edge.draining_server import DrainingServer
    from cadenza.edge.http_protocol import timed_h11_protocol
    from cadenza.logs import configure_logging

    configure_logging(config.server.log_level, process="edge")
    try:
        app = create_app(config)
    except (ApiKeyFileError, GuardError) as exc:
        print(f"cadenza: {exc}", file=sys.stderr)
        return 2
    server_config = uvicorn.Config(
        app,
        host=config.server.host,
        port=config.server.port,
        log_level=config.server.log_level,
        timeout_graceful_shutdown=5,
        ws_max_size=config.server.ws_max_message_bytes,
        # Audio does not compress: per-message deflate of PCM and Opus frames cost a third of
        # the edge's CPU under load for a few percent fewer bytes
        # (docs/journal/2026-12-02-engine-edge-and-admission-on-two-cores.md).
        ws_per_message_deflate=False,
        http=timed_h11_protocol(
            config.server.request_head_timeout_s, config.server.send_buffer_bytes
        ),
    )
    DrainingServer(
        server_config, app, config.server.drain_timeout_s, freeze_heap=config.server.gc_freeze
    ).run()
    return 0


def _generate(config: CadenzaConfig, args: argparse.Namespace) -> int:
    from cadenza.edge.admission.validation import InvalidRequest, validate_synthesis
    from cadenza.edge.media.wav import wav_file_bytes
    from cadenza.engine.engine import Engine
    from cadenza.engine.models.checkpoint import CheckpointError
    from cadenza.engine.models.registry import UnknownModelError
    from cadenza.hub_cache import NotInHubCache

    started = time.perf_counter()
    try:
        engine = Engine.from_config(config)
        sampling = engine.model.default_sampling.with_overrides(
            seed=args.seed,
            temperature=args.temperature,
            top_k=args.top_k,
            top_p=args.top_p,
            min_p=args.min_p,
            repetition_penalty=args.repetition_penalty,
        )
        validate_synthesis(
            model=config.model.name,
            text=args.text,
            voice=args.voice,
            max_duration_s=args.max_duration_s,
            served_model=engine.model_name,
            voices=engine.voices,
            limits=config.limits,
        )
    except (UnknownModelError, CheckpointError, InvalidRequest, ValueError, NotInHubCache) as exc:
        print(f"cadenza: {exc}", file=sys.stderr)
        return 2
    loaded = time.perf_counter()
    audio = engine.synthesize(
        args.text,
        voice=args.voice,
        max_duration_s=args.max_duration_s,
        sampling=sampling,
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


def _plan(config: CadenzaConfig, args: argparse.Namespace) -> int:
    from cadenza.kv_plan import KVPlan, parse_bytes

    try:
        shape = {"layers": args.layers, "kv_heads": args.kv_heads, "head_dim": args.head_dim}
        heads = args.heads
        if args.model is not None:
            model_shape, heads = _model_shape(args.model)
            shape = {key: shape[key] or value for key, value in model_shape.items()}
        missing = [f"--{k.replace('_', '-')}" for k, v in shape.items() if v is None]
        if missing:
            raise ValueError(f"give {', '.join(missing)} (or --model)")
        plan = KVPlan(
            **shape,
            kv_dtype=args.kv_dtype,
            context=args.context,
            heads=heads,
            batch=args.batch,
            memory_bytes=parse_bytes(args.memory) if args.memory else None,
            weights_bytes=parse_bytes(args.weights_bytes) if args.weights_bytes else 0,
        )
    except ValueError as exc:
        print(f"cadenza: {exc}", file=sys.stderr)
        return 2
    result = plan.to_dict()
    if args.model is not None and not args.no_measure:
        from cadenza.hub_cache import NotInHubCache

        try:
            result["realtime"] = _measured_capacity(config, args.model)
        except (ValueError, NotInHubCache) as exc:  # a config without weights plans, unmeasured
            result["realtime"] = f"not measured: {exc}"
    if args.json:
        print(json.dumps(result))
    else:
        width = max(len(key) for key in result)
        for key, value in result.items():
            shown = (
                f"{value:,}" if isinstance(value, int) and not isinstance(value, bool) else value
            )
            print(f"{key:<{width}}  {shown}")
    return 0


def _measured_capacity(config: CadenzaConfig, model: str) -> dict[str, Any]:
    """Real-time streams ``model`` holds on this device: the start-up calibration (cached, as
    the server's) read through the same capacity model the server admits with, measured as
    the server's first engine replica runs (its cores and threads: this process is pinned
    like it), and counted for as many replicas as the server would start."""
    from cadenza.contract.cpu_replicas import core_sharers, replica_count, usable_cores
    from cadenza.edge.admission.capacity import AdmittedLoad, CapacityModel
    from cadenza.engine.builder import build_serving_engine
    from cadenza.ipc.engine_loop import place_replica

    config = config.model_copy(update={"model": config.model.model_copy(update={"name": model})})
    engine = config.engine
    replicas = replica_count(engine.replicas, config.model.device, engine.mode, engine.kind)
    sharers = core_sharers(replicas, len(usable_cores()))
    info = build_serving_engine(place_replica(config, 0)).info
    calibration = info.calibration
    capacity = CapacityModel(
        info, config.admission, core_sharers=sharers if info.device == "cpu" else 1
    )
    return {
        "device": None if calibration is None else calibration.device_name,
        "calibration": None if calibration is None else calibration.source,
        "precision": None if info.precision is None else info.precision.describe(),
        "replicas": replicas,
        "step_budget_ms": round(capacity.step_budget_ms, 3),
        "max_streams": replicas * capacity.max_streams(),
        "max_streams_per_replica": capacity.max_streams(),
        "realtime_limit": capacity.realtime_limit(),
        "kv_limit": capacity.kv_limit(),
        "prefill_burst_per_replica": capacity.prefill_burst(AdmittedLoad()),
        "calibration_consistent": None if calibration is None else calibration.consistent,
        "decode_step_ms": None
        if calibration is None
        else {str(t): round(ms, 3) for t, _, ms in calibration.model.decode_points},
    }


def _model_shape(name_or_path: str) -> tuple[dict[str, int], int]:
    """Layers, KV heads, head width (and query heads) of a model, without loading weights."""
    from cadenza.engine.models.registry import UnknownModelError, paged_backbone_config

    try:
        config = paged_backbone_config(name_or_path)
    except UnknownModelError as exc:
        raise ValueError(str(exc)) from exc
    shape = {
        "layers": config.num_layers,
        "kv_heads": config.num_kv_heads,
        "head_dim": config.head_dim,
    }
    return shape, config.num_heads


def _loadtest(_: CadenzaConfig, args: argparse.Namespace) -> int:
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
            chaos=None
            if args.chaos_kill_every is None
            else ChaosSchedule.parse(args.chaos_kill_every),
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


def _bench(_: CadenzaConfig, args: argparse.Namespace) -> int:
    from cadenza.bench import (
        codec_throughput,
        cpu_precision,
        csm_throughput,
        engine_throughput,
        snac_throughput,
    )

    if args.target == "pacing":
        from cadenza.bench import pacing

        print(json.dumps(pacing.run(args.url, args.peers, args.seconds)))
        return 0

    default = {"engine": "1,4,16", "snac": "1,4,8", "precision": "1,16,32", "csm": "1,4,8"}.get(
        args.target, "1,4,8,16"
    )
    try:
        sizes = tuple(int(b) for b in (args.batch_sizes or default).split(","))
    except ValueError:
        print(f"cadenza: --batch-sizes must be integers, got {args.batch_sizes!r}", file=sys.stderr)
        return 2
    if not sizes or min(sizes) < 1 or args.repeats < 1:
        print("cadenza: batch sizes and --repeats must be positive", file=sys.stderr)
        return 2
    runners: dict[str, Callable[..., dict[str, Any]]] = {
        "engine": engine_throughput.run,
        "codec": codec_throughput.run,
        "snac": snac_throughput.run,
        "precision": cpu_precision.run,
    }
    if args.target == "csm":
        result = csm_throughput.run(
            sizes, repeats=args.repeats, progress=not args.json, shape=args.shape
        )
        print(json.dumps(result, indent=None if args.json else 2))
        return 0
    runner = runners[args.target]
    result = runner(sizes, repeats=args.repeats, progress=not args.json)
    print(json.dumps(result, indent=None if args.json else 2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
