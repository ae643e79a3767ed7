"""Building an engine from the configuration: resolve the device and dtypes, load the model
(ready to serve) and its codec, size the KV cache, and wire the parts together
(:func:`build_engine`). :func:`pretrained_config` is the configuration behind
:meth:`Engine.from_pretrained`'s keyword options; :func:`build_serving_engine` is what the
engine process runs: the configured engine (batching or naive), calibrated, after it said
which native kernels it runs."""

from __future__ import annotations

import gc
import logging
from collections.abc import Callable

import torch

from cadenza.codecs import load_codec
from cadenza.codecs.codec import AudioCodec
from cadenza.config import (
    CadenzaConfig,
    CalibrationConfig,
    CpuConfig,
    EngineConfig,
    LimitsConfig,
    RealtimeConfig,
)
from cadenza.contract.cpu_replicas import replica_count
from cadenza.contract.kv_memory import StreamShape
from cadenza.contract.native_kernels import NativeKernel, summary
from cadenza.contract.stream_length import stream_length
from cadenza.engine.audio_stage import AudioStage, TokenOutputs
from cadenza.engine.chunk_policy import NO_FRAMES, config_in_codec_frames
from cadenza.engine.device import resolve_device, resolve_dtype, resolve_kv_dtype
from cadenza.engine.engine import Engine
from cadenza.engine.identity import describe, plan_of, shape_of
from cadenza.engine.kv.kv_cache_manager import KVCacheManager
from cadenza.engine.kv.page_pool import PagePool
from cadenza.engine.kv.paged_kv_cache import PagedKVCache, kv_budget_bytes
from cadenza.engine.model_runner import ModelRunner
from cadenza.engine.models.model import AudioTokenModel
from cadenza.engine.models.registry import checkpoint_identity, load_model
from cadenza.engine.precision import codec_dtype as resolve_codec_dtype
from cadenza.engine.precision import precision_of, products_dtype
from cadenza.engine.realtime.deadline_policy import DeadlinePolicy
from cadenza.engine.realtime.step_telemetry import StepTelemetry
from cadenza.engine.request_intake import RequestIntake
from cadenza.engine.scheduler import Scheduler
from cadenza.engine.serving_engine import ServingEngine
from cadenza.engine.static_decode import fixed_decode_width, uses_fixed_decode_shapes
from cadenza.kernels.native import loader

log = logging.getLogger(__name__)


def pretrained_config(
    name_or_path: str = "cadenza-tiny",
    *,
    device: str = "cpu",
    dtype: str = "auto",
    seed: int = 0,
    page_size: int | None = None,
    max_num_batched_tokens: int | None = None,
    max_num_seqs: int | None = None,
    enable_prefix_caching: bool | None = None,
    kv_cache_memory_bytes: int | None = None,
    engine_config: EngineConfig | None = None,
    realtime: RealtimeConfig | None = None,
    cpu: CpuConfig | None = None,
    calibration: CalibrationConfig | None = None,
    limits: LimitsConfig | None = None,
    weights_dtype: str = "auto",
    codec: str | None = None,
    codec_noise: bool = True,
    served_name: str | None = None,
) -> CadenzaConfig:
    """The configuration :meth:`Engine.from_pretrained` builds its engine with: the model
    ``name_or_path`` with these ``[model]`` keys (on the CPU unless ``device`` says otherwise),
    the sections given (defaults for the others; the environment is not read), and the
    ``[engine]`` keys given here over those of ``engine_config``."""
    overrides = {
        key: value
        for key, value in {
            "page_size": page_size,
            "max_num_batched_tokens": max_num_batched_tokens,
            "max_num_seqs": max_num_seqs,
            "enable_prefix_caching": enable_prefix_caching,
            "kv_cache_memory_bytes": kv_cache_memory_bytes,
        }.items()
        if value is not None
    }
    engine = (engine_config or EngineConfig()).model_dump()
    model = {
        "name": name_or_path,
        "device": device,
        "dtype": dtype,
        "seed": seed,
        "weights_dtype": weights_dtype,
        "codec": codec,
        "codec_noise": codec_noise,
        "served_name": served_name,
    }
    return CadenzaConfig.model_validate(
        {
            "model": model,
            "engine": {**engine, **overrides},
            "realtime": realtime or RealtimeConfig(),
            "cpu": cpu or CpuConfig(),
            "calibration": calibration or CalibrationConfig(),
            "limits": limits or LimitsConfig(),
        }
    )


def build_engine(config: CadenzaConfig, fixed_decode_shapes: bool | None = None) -> Engine:
    """The engine ``config`` describes: ``model.name`` (a built-in name, a checkpoint directory
    or a hub id in the local hub cache) on ``model.device`` in its dtypes, with its codec
    (``model.codec`` instead of the one the model names; ``model.codec_noise`` off switches a
    codec's noise layers, SNAC's, off), its KV cache and batch (``engine``), its chunk plan and
    targets (``realtime``) and the CPU's fast paths (``cpu``). ``model.weights_dtype = int8``
    makes every linear layer weight-only int8 (W8A16). ``fixed_decode_shapes``: whether
    decode steps run at fixed shapes (:mod:`cadenza.engine.static_decode`); ``None``: where
    the builder captures them as CUDA graphs (CUDA, ``engine.cuda_graphs``); ``True`` on the
    CPU runs them eagerly there, to check what a GPU replays."""
    if config.model.torch_threads:
        torch.set_num_threads(config.model.torch_threads)
    model_config, engine_config = config.model, config.engine
    name_or_path, seed = model_config.name, model_config.seed
    device, dtype = model_config.device, model_config.dtype
    weights_dtype = model_config.weights_dtype
    codec, codec_noise = model_config.codec, model_config.codec_noise
    torch_device = resolve_device(device)
    model_dtype = resolve_dtype(dtype, torch_device)
    named = dtype != "auto"
    linear_dtype = products_dtype(config.cpu.linear_dtype, model_dtype, named)
    model = load_model(
        name_or_path,
        seed=seed,
        device=torch_device,
        dtype=model_dtype,
        weights_dtype=weights_dtype,
        pack_cpu_weights=config.cpu.pack_weights,
        cpu_linear_dtype=linear_dtype,
        fused_cpu_decode=config.cpu.fused_decode,
    )
    layout = model.layout
    fused = model.fused_decode
    kv_dtype = resolve_kv_dtype(
        engine_config.kv_dtype,
        model_dtype,
        steps_read_bf16=fused is not None and fused.weight_dtype == torch.bfloat16,
    )
    fixed_shapes = uses_fixed_decode_shapes(model, torch_device, engine_config.cuda_graphs)
    if fixed_decode_shapes is not None:
        fixed_shapes = fixed_decode_shapes and not model.keeps_stream_state
    max_num_seqs = engine_config.max_num_seqs or default_max_num_seqs(engine_config, torch_device)
    graph_bytes = 0
    if fixed_shapes and engine_config.cuda_graphs:
        page_bytes = model.kv_spec.bytes_per_page(engine_config.page_size, kv_dtype)
        width = fixed_decode_width(
            max(kv_budget_bytes(engine_config, torch_device) // page_bytes, 1),
            engine_config.page_size,
            model.max_positions,
        )
        graph_bytes = decode_graph_bytes(
            model, kv_dtype, engine_config.page_size, max_num_seqs, width
        )
    kv_budget = kv_budget_bytes(engine_config, torch_device, reserved=graph_bytes)
    max_num_seqs = streams_with_state(model, max_num_seqs, kv_budget)
    kv_budget -= max_num_seqs * model.state_bytes_per_stream
    kv_cache = PagedKVCache.from_budget(
        model.kv_spec,
        kv_budget,
        engine_config.page_size,
        kv_dtype,
        torch_device,
        pad_page=fixed_shapes,
    )
    # Decode steps that run fused read each sequence's own pages: no padding to the longest.
    decodes_padded = fused is None or not fused.supports_cache(kv_cache)
    kv = KVCacheManager(
        PagePool(kv_cache.num_pages, engine_config.enable_prefix_caching),
        engine_config.page_size,
        engine_config.reserve_max_output,
    )
    codec_model: AudioCodec | None = None
    codec_dtype = torch.float32
    policy = None
    frames = NO_FRAMES
    if layout.produces_audio:
        codec_name = codec or model.codec_name
        if codec_name is None:
            raise ValueError(f"{name_or_path} produces audio but names no codec")
        codec_model = load_codec(codec_name, device=torch_device, seed=seed, noise=codec_noise)
        codec_dtype = resolve_codec_dtype(
            config.cpu.codec_dtype, codec_model, torch_device, model_dtype, named
        )
        frames = config_in_codec_frames(
            config, codec_model.frame_rate, codec_model.lookahead_frames, layout.steps_per_frame
        )
        policy = DeadlinePolicy(
            layout,
            frame_period_s=1.0 / codec_model.frame_rate,
            first_chunk_frames=frames.first_chunk_frames,
            chunk_frames=frames.chunk_frames,
            headroom=config.realtime.headroom,
            min_prefill_tokens=engine_config.page_size,
            max_lead_s=config.realtime.max_lead_ms / 1000.0,
            lead_hysteresis_s=config.realtime.lead_hysteresis_ms / 1000.0,
            decodes_padded=decodes_padded,
        )
    telemetry = StepTelemetry(policy, decodes_padded)
    audio: AudioStage | TokenOutputs = TokenOutputs()
    if codec_model is not None:
        audio = AudioStage(
            codec_model,
            layout,
            max_streams=engine_config.max_pending_requests,
            compute_dtype=codec_dtype,
            first_chunk_frames=frames.first_chunk_frames,
            chunk_frames=frames.chunk_frames,
            replay_frames=frames.replay_frames,
            telemetry=telemetry,
            device=torch_device,
        )
    # Prefix-cache keys: equal token rows mean equal KV only for the same weights and dtypes.
    extra_keys = (
        checkpoint_identity(name_or_path),
        f"codec={codec or model.codec_name}",
        str(model_dtype),
        f"kv={kv_dtype}",
        f"w={weights_dtype}",
        f"linear={linear_dtype}",
        f"codec_dtype={codec_dtype}",
    )
    shape = shape_of(model, engine_config.page_size)
    follows_kv = engine_config.max_num_seqs is None and torch_device.type == "cuda"
    if follows_kv and codec_model is not None:
        held = nominal_streams_held(
            kv_cache.num_pages, shape, codec_model.frame_rate, config.admission.nominal_stream_s
        )
        max_num_seqs = min(max_num_seqs, held)
    scheduler = Scheduler(kv, layout, engine_config.max_num_batched_tokens, max_num_seqs, policy)
    precision = precision_of(
        model,
        kv_dtype,
        codec_dtype if codec_model is not None else None,
        named,
        int8_weights=weights_dtype == "int8",
    )
    frame_rate = 0.0 if codec_model is None else codec_model.frame_rate
    announced = describe(
        model,
        model_name=config.model.public_name,
        sample_rate=0 if codec_model is None else codec_model.sample_rate,
        frame_rate=frame_rate,
        shape=shape,
        plan=plan_of(
            model,
            shape,
            config.realtime,
            frames,
            frame_rate,
            0 if codec_model is None else codec_model.lookahead_frames,
        ),
        kv_pages_total=kv.pool.num_pages,
        max_num_seqs=scheduler.max_num_seqs,
        decodes_padded=decodes_padded,
        precision=precision,
        codes_as_ids=codec_model is None or codec_model.codebook_size <= 1 << 16,
    )
    return Engine(
        model,
        model_name=config.model.public_name,
        config=config,
        frames=frames,
        kv_cache=kv_cache,
        kv=kv,
        scheduler=scheduler,
        intake=RequestIntake(
            model,
            codec_model,
            extra_keys=extra_keys,
            realtime=config.realtime,
            limits=config.limits,
        ),
        audio=audio,
        policy=policy,
        telemetry=telemetry,
        announced=announced,
    )


CPU_MAX_NUM_SEQS = 64
"""``engine.max_num_seqs`` unset, on the CPU."""
CUDA_MAX_NUM_SEQS = 256
"""``engine.max_num_seqs`` unset, on CUDA: the most; fewer where the KV cache holds fewer
nominal streams (``admission.nominal_stream_s``)."""


def default_max_num_seqs(config: EngineConfig, device: torch.device) -> int:
    """The most sequences a step runs when ``engine.max_num_seqs`` is unset, before the KV
    cache is sized: :data:`CPU_MAX_NUM_SEQS` or :data:`CUDA_MAX_NUM_SEQS`, within the step's
    token budget and the requests the engine holds."""
    most = CUDA_MAX_NUM_SEQS if device.type == "cuda" else CPU_MAX_NUM_SEQS
    return min(most, config.max_num_batched_tokens, config.max_pending_requests)


def nominal_streams_held(
    kv_pages: int, shape: StreamShape, frame_rate: float, nominal_stream_s: float
) -> int:
    """How many nominal streams (``admission.nominal_stream_s`` of audio from the nominal
    text, as admission counts them) ``kv_pages`` pages hold; at least 1."""
    frames = stream_length(nominal_stream_s, frame_rate, shape).frames
    return max(kv_pages // shape.pages(shape.nominal_prompt_tokens, frames), 1)


def decode_graph_bytes(
    model: AudioTokenModel,
    kv_dtype: torch.dtype,
    page_size: int,
    max_num_seqs: int,
    width: int,
) -> int:
    """The device memory the decode steps' CUDA graphs take for up to ``max_num_seqs`` decodes
    with page tables ``width`` pages wide, measured: captured once over a one-page cache, then
    released (the KV budget leaves this much free for the engine's own capture). 0 off CUDA:
    nothing is captured there."""
    if model.device.type != "cuda":
        return 0
    probe = PagedKVCache(model.kv_spec, 1, page_size, kv_dtype, model.device, pad_page=True)
    runner = ModelRunner(
        model, probe, max_num_seqs=max_num_seqs, cuda_graphs=True, decode_width=width
    )
    taken = runner.graph_memory_bytes
    del runner, probe
    gc.collect()
    torch.cuda.empty_cache()
    log.info("decode graphs for up to %d streams take %.0f MB", max_num_seqs, taken / 1e6)
    return taken


STATE_SHARE = 0.5
"""The most of the KV budget a stateful model's per-stream state may take (the rest is the
paged cache)."""


def streams_with_state(model: AudioTokenModel, max_num_seqs: int, kv_budget: int) -> int:
    """How many streams the engine runs at once: ``max_num_seqs``, fewer where the model's
    per-stream state (a KV class of its own, set aside for every such stream before the paged
    cache takes the rest of the budget) would take more than :data:`STATE_SHARE` of
    ``kv_budget`` (said in the log). Raises ``ValueError`` when not even one stream's fits."""
    per_stream = model.state_bytes_per_stream
    if not per_stream:
        return max_num_seqs
    fitting = int(kv_budget * STATE_SHARE) // per_stream
    if fitting < 1:
        raise ValueError(
            f"one stream's state takes {per_stream:,} bytes, more than {STATE_SHARE:.0%} of "
            f"the KV budget ({kv_budget:,} bytes): raise engine.kv_cache_memory_fraction or "
            "engine.kv_cache_memory_bytes"
        )
    if fitting < max_num_seqs:
        log.warning(
            "%d of engine.max_num_seqs %d streams fit: each stream's state takes %.1f MB and "
            "may have %.0f%% of the KV budget (%.1f MB); raise engine.kv_cache_memory_fraction "
            "for more",
            fitting,
            max_num_seqs,
            per_stream / 1e6,
            100 * STATE_SHARE,
            kv_budget / 1e6,
        )
        return fitting
    return max_num_seqs


def load_native_kernels() -> tuple[NativeKernel, ...]:
    """Every native kernel library, loaded now for the loader's level (built where this
    machine has none yet), and one line in the log: which loaded, for which level and ISA; a
    warning when any is off (no C++ compiler: every one)."""
    kernels = loader.report()
    if all(kernel.loaded for kernel in kernels):
        log.info("%s", summary(kernels))
    else:
        log.warning("%s", summary(kernels))
    return kernels


def build_serving_engine(
    config: CadenzaConfig, on_stage: Callable[[str], None] | None = None
) -> ServingEngine:
    """The configured engine, ready to serve: the naive baseline, or the batching engine with
    its step time calibrated (or read from the calibration cache) beside the model's other
    replicas, which the edge starts together: what one replica's step costs while the others
    work, as in service. Its native kernels are loaded first, and
    logged (:func:`load_native_kernels`). ``on_stage`` is told what the start is doing as it
    moves on (loading, calibrating and its attempts, warming up), for the edge."""
    stage = on_stage or (lambda _: None)
    stage("loading")
    load_native_kernels()
    if config.engine.kind == "naive":
        from cadenza.engine.naive_engine import NaiveEngine

        return NaiveEngine.from_config(config)
    from cadenza.engine.realtime.calibration import load_or_calibrate

    engine = build_engine(config)
    replicas = replica_count(
        config.supervision.replicas,
        config.model.device,
        config.supervision.mode,
        config.engine.kind,
    )
    if engine.precision is not None:
        log.info("%s computes in %s", config.model.name, engine.precision.describe())
    engine.apply_calibration(
        load_or_calibrate(engine, config.model.seed, replicas - 1, progress=on_stage)
    )
    return engine
