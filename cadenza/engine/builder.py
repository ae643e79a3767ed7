"""Building an engine from a model's name or from the configuration: resolve the device and
dtypes, load the model (ready to serve) and its codec, size the KV cache, and wire the parts
together. :func:`build_serving_engine` is what the engine process runs: the configured engine
(batching or naive), calibrated, after it said which native kernels it runs."""

from __future__ import annotations

import logging

import torch

from cadenza.codecs import load_codec
from cadenza.codecs.codec import AudioCodec, CodecError
from cadenza.config import CadenzaConfig, EngineConfig, LimitsConfig
from cadenza.contract.cpu_replicas import replica_count
from cadenza.contract.native_kernels import NativeKernel, summary
from cadenza.engine.audio_stage import AudioStage, TokenOutputs
from cadenza.engine.chunk_policy import codec_chunk_frames
from cadenza.engine.device import resolve_device, resolve_dtype, resolve_kv_dtype
from cadenza.engine.engine import Engine
from cadenza.engine.kv.kv_cache_manager import KVCacheManager
from cadenza.engine.kv.page_pool import PagePool
from cadenza.engine.kv.paged_kv_cache import PagedKVCache, kv_budget_bytes
from cadenza.engine.models.llama import fused_cpu_decode_of
from cadenza.engine.models.registry import checkpoint_identity, load_model
from cadenza.engine.realtime.deadline_policy import DeadlinePolicy
from cadenza.engine.realtime.step_telemetry import StepTelemetry
from cadenza.engine.request_intake import RequestIntake
from cadenza.engine.scheduler import Scheduler
from cadenza.ipc.serving_engine import ServingEngine
from cadenza.kernels.cpu_linear import native_bf16_matmul, resolve_cpu_linear_dtype
from cadenza.kernels.native import loader

log = logging.getLogger(__name__)


def build_engine(
    name_or_path: str = "cadenza-tiny",
    *,
    device: str = "cpu",
    dtype: str = "float32",
    seed: int = 0,
    page_size: int | None = None,
    max_num_batched_tokens: int | None = None,
    max_num_seqs: int | None = None,
    enable_prefix_caching: bool | None = None,
    kv_cache_memory_bytes: int | None = None,
    engine_config: EngineConfig | None = None,
    limits: LimitsConfig | None = None,
    weights_dtype: str = "auto",
    codec: str | None = None,
    codec_noise: bool = True,
    served_name: str | None = None,
) -> Engine:
    """An engine for a built-in model name, a checkpoint directory or a hub id in the local
    hub cache, on ``device``. ``weights_dtype="int8"`` makes every linear layer weight-only
    int8 (W8A16). ``codec`` replaces the codec the model names (a built-in name, directory or
    hub id); ``codec_noise`` switches a codec's noise layers (SNAC's) off when false. Keyword
    arguments given here override the same fields of ``engine_config``. ``served_name``: the
    name clients know the model by (default: ``name_or_path``)."""
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
    config = (engine_config or EngineConfig()).model_copy(update=overrides)
    limits = limits or LimitsConfig()
    torch_device = resolve_device(device)
    model_dtype = resolve_dtype(dtype, torch_device)
    linear_dtype = resolve_cpu_linear_dtype(config.cpu_linear_dtype)
    model = load_model(
        name_or_path,
        seed=seed,
        device=torch_device,
        dtype=model_dtype,
        weights_dtype=weights_dtype,
        pack_cpu_weights=config.pack_cpu_weights,
        cpu_linear_dtype=linear_dtype,
        fused_cpu_decode=config.fused_cpu_decode,
    )
    layout = model.layout
    fused = fused_cpu_decode_of(model)
    kv_dtype = resolve_kv_dtype(
        config.kv_dtype,
        model_dtype,
        steps_read_bf16=fused is not None and fused.weight_dtype == torch.bfloat16,
    )
    kv_cache = PagedKVCache.from_budget(
        model.kv_spec,
        kv_budget_bytes(config, torch_device),
        config.page_size,
        kv_dtype,
        torch_device,
    )
    # Decode steps that run fused read each sequence's own pages: no padding to the longest.
    decodes_padded = fused is None or not fused.supports_cache(kv_cache)
    kv = KVCacheManager(
        PagePool(kv_cache.num_pages, config.enable_prefix_caching),
        config.page_size,
        config.reserve_max_output,
    )
    codec_model: AudioCodec | None = None
    codec_dtype = torch.float32
    policy = None
    if layout.produces_audio:
        codec_name = codec or model.codec_name
        if codec_name is None:
            raise ValueError(f"{name_or_path} produces audio but names no codec")
        codec_model = load_codec(codec_name, device=torch_device, seed=seed, noise=codec_noise)
        codec_dtype = resolve_codec_dtype(config.codec_dtype, codec_model, torch_device)
        config = config.model_copy(
            update={
                "chunk_frames": codec_chunk_frames(config.chunk_frames, codec_model.frame_rate),
                # A codec that looks ahead holds a chunk's last frames back: the first chunk
                # waits for them, so that it brings its full duration of audio.
                "first_chunk_frames": codec_chunk_frames(
                    config.first_chunk_frames, codec_model.frame_rate
                )
                + codec_model.lookahead_frames,
                # The same stretch of audio at any frame rate, in the layout's steps: a model
                # of 12.5 frames a second is timed over 20 steps, not 120 (10 s of audio).
                "calibration_steps": max(
                    2,
                    codec_chunk_frames(config.calibration_steps, codec_model.frame_rate)
                    * layout.steps_per_frame,
                ),
            }
        )
        policy = DeadlinePolicy(
            layout,
            frame_period_s=1.0 / codec_model.frame_rate,
            first_chunk_frames=config.first_chunk_frames,
            chunk_frames=config.chunk_frames,
            headroom=config.realtime_headroom,
            min_prefill_tokens=config.page_size,
            max_lead_s=config.max_lead_ms / 1000.0,
            lead_hysteresis_s=config.lead_hysteresis_ms / 1000.0,
            decodes_padded=decodes_padded,
        )
    telemetry = StepTelemetry(policy, decodes_padded)
    audio: AudioStage | TokenOutputs = TokenOutputs()
    if codec_model is not None:
        audio = AudioStage(
            codec_model,
            layout,
            max_streams=config.max_pending_requests,
            compute_dtype=codec_dtype,
            first_chunk_frames=config.first_chunk_frames,
            chunk_frames=config.chunk_frames,
            replay_frames=config.resume_replay_frames,
            telemetry=telemetry,
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
    return Engine(
        model,
        model_name=served_name or name_or_path,
        config=config,
        limits=limits,
        kv_cache=kv_cache,
        kv=kv,
        scheduler=Scheduler(kv, layout, config.max_num_batched_tokens, config.max_num_seqs, policy),
        intake=RequestIntake(
            model, codec_model, extra_keys=extra_keys, config=config, limits=limits
        ),
        audio=audio,
        policy=policy,
        telemetry=telemetry,
    )


def resolve_codec_dtype(setting: str, codec: AudioCodec, device: torch.device) -> torch.dtype:
    """``engine.codec_dtype`` for ``codec`` on ``device``: ``auto`` is bf16 on a CPU with native
    bf16 matrix units when the codec streams in bf16, else fp32 (and fp32 on a GPU). Raises
    :class:`CodecError` when bf16 is asked of a codec that cannot stream in it."""
    if setting == "float32":
        return torch.float32
    supported = torch.bfloat16 in codec.streaming_dtypes
    if setting == "bfloat16":
        if not supported:
            raise CodecError(f"{type(codec).__name__} streams in float32 only")
        return torch.bfloat16
    native = device.type == "cpu" and native_bf16_matmul()
    return torch.bfloat16 if native and supported else torch.float32


def engine_from_config(config: CadenzaConfig) -> Engine:
    """The engine the configuration describes (model, device, dtypes, engine, limits)."""
    if config.model.torch_threads:
        torch.set_num_threads(config.model.torch_threads)
    return build_engine(
        config.model.name,
        device=config.model.device,
        dtype=config.model.dtype,
        seed=config.model.seed,
        engine_config=config.engine,
        limits=config.limits,
        weights_dtype=config.model.weights_dtype,
        codec=config.model.codec,
        codec_noise=config.model.codec_noise,
        served_name=config.model.served_name,
    )


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


def build_serving_engine(config: CadenzaConfig) -> ServingEngine:
    """The configured engine, ready to serve: the naive baseline, or the batching engine with
    its step time calibrated (or read from the calibration cache) beside the model's other
    replicas, which the edge starts together: what one replica's step costs while the others
    work, as in service. Its native kernels are loaded first, and logged
    (:func:`load_native_kernels`)."""
    load_native_kernels()
    if config.engine.kind == "naive":
        from cadenza.engine.naive_engine import NaiveEngine

        return NaiveEngine.from_config(config)
    from cadenza.engine.realtime.calibration import load_or_calibrate

    engine = engine_from_config(config)
    replicas = replica_count(
        config.engine.replicas, config.model.device, config.engine.mode, config.engine.kind
    )
    engine.apply_calibration(load_or_calibrate(engine, config.model.seed, replicas - 1))
    return engine
