"""``cadenza plan``: KV memory per token and sequence, how many sequences fit, and (with
``--model``) the real-time capacity the server would advertise on this device."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from cadenza.config import CadenzaConfig


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
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
    plan.add_argument(
        "--kv-dtype",
        choices=["fp32", "fp16", "bf16", "int8", "fp8"],
        help="bf16 unless given",
    )
    plan.add_argument(
        "--context",
        type=int,
        help="tokens per sequence (required without --model; with --model, default: the "
        "nominal stream's, measured)",
    )
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
    plan.set_defaults(run=run)


def run(config: CadenzaConfig, args: argparse.Namespace) -> int:
    from cadenza.hub_cache import NotInHubCache
    from cadenza.kv_plan import KVPlan, parse_bytes

    try:
        context = args.context
        measured: dict[str, Any] | str | None = None
        if context is None:
            if args.model is None or args.no_measure:
                raise ValueError("give --context (or --model, measured, for its nominal stream)")
            measured, context = _measured_capacity(config, args.model)
            if context is None:
                raise ValueError(f"{args.model} makes no audio: give --context")
        shape = {"layers": args.layers, "kv_heads": args.kv_heads, "head_dim": args.head_dim}
        heads = args.heads
        kv_dtype = args.kv_dtype or "bf16"
        state_bytes = 0
        if args.model is not None:
            model_shape, heads = _model_shape(args.model)
            shape = {key: shape[key] or value for key, value in model_shape.items()}
            state_bytes = _stream_state_bytes(args.model, kv_dtype)
        missing = [f"--{k.replace('_', '-')}" for k, v in shape.items() if v is None]
        if missing:
            raise ValueError(f"give {', '.join(missing)} (or --model)")
        plan = KVPlan(
            **shape,
            kv_dtype=kv_dtype,
            state_bytes_per_sequence=state_bytes,
            context=context,
            heads=heads,
            batch=args.batch,
            memory_bytes=parse_bytes(args.memory) if args.memory else None,
            weights_bytes=parse_bytes(args.weights_bytes) if args.weights_bytes else 0,
        )
    except (ValueError, NotInHubCache) as exc:
        print(f"cadenza: {exc}", file=sys.stderr)
        return 2
    result = plan.to_dict()
    if args.model is not None and not args.no_measure:
        if measured is None:
            try:
                measured, _ = _measured_capacity(config, args.model)
            except (ValueError, NotInHubCache) as exc:  # a config without weights: unmeasured
                measured = f"not measured: {exc}"
        result["realtime"] = measured
    return _print(args, result)


def _print(args: argparse.Namespace, result: dict[str, Any]) -> int:
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


def _measured_capacity(config: CadenzaConfig, model: str) -> tuple[dict[str, Any], int | None]:
    """Real-time streams ``model`` holds on this device: the start-up calibration (cached, as
    the server's) read through the same capacity model the server admits with, measured as
    the server's first engine replica runs (its cores and threads: this process is pinned
    like it), and counted for as many replicas as the server would start; and the positions
    of its nominal stream (the nominal prompt and ``admission.nominal_stream_s`` of audio;
    ``None`` for a model without audio)."""
    from cadenza.contract.cpu_replicas import core_sharers, replica_count, usable_cores
    from cadenza.contract.stream_length import frames_for_duration
    from cadenza.edge.admission.capacity import AdmittedLoad, CapacityModel
    from cadenza.engine.builder import build_serving_engine
    from cadenza.ipc.engine_side.replica_placement import place_replica

    config = config.model_copy(update={"model": config.model.model_copy(update={"name": model})})
    supervision = config.supervision
    replicas = replica_count(
        supervision.replicas, config.model.device, supervision.mode, config.engine.kind
    )
    sharers = core_sharers(replicas, len(usable_cores()))
    info = build_serving_engine(place_replica(config, 0)).info
    calibration = info.calibration
    capacity = CapacityModel(
        info, config.admission, core_sharers=sharers if info.device == "cpu" else 1
    )
    nominal_context = None
    if info.frame_rate > 0:
        frames = frames_for_duration(config.admission.nominal_stream_s, info.frame_rate)
        nominal_context = info.shape.nominal_prompt_tokens + info.shape.steps_for_frames(frames)
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
    }, nominal_context


def _stream_state_bytes(name_or_path: str, kv_dtype: str) -> int:
    """The most bytes one stream's per-stream model state holds (an encoder-decoder's
    cross-attention keys and values), in the KV dtype's width (int8 and fp8: 16 bits, the
    state is not quantized)."""
    import torch

    from cadenza.engine.models.registry import stream_state_bytes

    widths = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
    return stream_state_bytes(name_or_path, widths.get(kv_dtype, torch.bfloat16))


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
