"""Pocket TTS checkpoints in the ``transformers`` layout: ``config.json`` (``model_type =
"pocket_tts"``, its ``flow_head_config`` inside), ``model.safetensors``,
``generation_config.json`` (the flow steps, the end-of-speech rule, sampling), the tokenizer
and the processor's files (its chat template, the end-of-speech tails by text length, and the
audio tokenizer it names: a directory or a hub id in the local hub cache).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from cadenza.contract.sampling import SamplingParams
from cadenza.engine.models.checkpoint import CheckpointError, load_weights, read_json
from cadenza.engine.models.family import ConfigJson, ModelFamily
from cadenza.engine.models.llama import LlamaBackboneConfig, RotaryEmbedding
from cadenza.engine.models.pocket_tts import (
    FlowHeadSpec,
    PocketTTSModel,
    PocketTTSSpec,
    TimestepEmbedding,
)
from cadenza.engine.models.pocket_tts_prompts import (
    audio_tokenizer_reference,
    load_prompts,
    load_voice_presets,
)

# Tensors of the training-only parts, which a checkpoint may carry and serving never reads.
_TRAINING_ONLY = ("loss_weighting.", "latent_stats_num_updates")
_FLOAT32_BUFFERS = ("latent_mean", "latent_std", "freqs")


def is_pocket_tts(directory: Path, config: ConfigJson) -> bool:
    return config.get("model_type") == "pocket_tts"


def pocket_tts_spec(directory: Path, config: ConfigJson) -> PocketTTSSpec:
    """The checkpoint's shape and generation constants; :class:`CheckpointError` naming what
    is wrong or unsupported."""
    if config.get("attention_bias"):
        raise CheckpointError(f"{directory}: attention_bias = true is not supported")
    if config.get("hidden_act", "gelu_pytorch_tanh") != "gelu_pytorch_tanh":
        raise CheckpointError(f"{directory}: hidden_act {config['hidden_act']!r} is not supported")
    try:
        rope = dict(config.get("rope_parameters") or {})
        if rope.get("rope_type", "default") != "default":
            raise CheckpointError(f"{directory}: rope type {rope['rope_type']!r} is not supported")
        heads = int(config.get("num_attention_heads", 16))
        hidden = int(config.get("hidden_size", 1024))
        backbone = LlamaBackboneConfig(
            hidden_size=hidden,
            num_layers=int(config.get("num_hidden_layers", 6)),
            num_heads=heads,
            num_kv_heads=int(config.get("num_key_value_heads") or heads),
            head_dim=int(config.get("head_dim") or hidden // heads),
            intermediate_size=int(config.get("intermediate_size", 4096)),
            rope_theta=float(rope.get("rope_theta") or config.get("rope_theta") or 10000.0),
        )
        latent_dim = int(config.get("latent_dim", 32))
        flow = dict(config.get("flow_head_config") or {})
        if flow.get("hidden_act", "silu") != "silu":
            raise CheckpointError(f"{directory}: flow head activation {flow['hidden_act']!r}")
        flow_type = str(flow.get("flow_type", "lsd"))
        if flow_type not in ("lsd", "drifting"):
            raise CheckpointError(f"{directory}: flow_type {flow_type!r} is not supported")
        flow_head = FlowHeadSpec(
            hidden_size=int(flow.get("hidden_size", 512)),
            num_layers=int(flow.get("num_hidden_layers", 6)),
            latent_dim=int(flow.get("latent_dim", latent_dim)),
            condition_dim=int(flow.get("condition_dim", hidden)),
            frequency_embedding_size=int(flow.get("frequency_embedding_size", 256)),
            layer_norm_eps=float(flow.get("layer_norm_eps", 1e-6)),
            rms_norm_eps=float(flow.get("rms_norm_eps", 1e-5)),
            max_period=float(flow.get("max_period", 10000.0)),
            flow_type=flow_type,
        )
        generation = _generation(directory)
        do_sample = bool(generation.get("do_sample", False))
        temperature = float(generation.get("temperature") or 1.0) if do_sample else 0.0
        spec = PocketTTSSpec(
            backbone=backbone,
            layer_norm_eps=float(config.get("layer_norm_eps", 1e-5)),
            vocab_size=int(config.get("vocab_size", 4004)),
            latent_dim=latent_dim,
            flow_head=flow_head,
            audio_prompt_id=int(config.get("audio_prompt_token_id", 4000)),
            audio_latent_id=int(config.get("audio_latent_token_id", 4001)),
            audio_prompt_bos_id=int(config.get("audio_prompt_bos_token_id", 4002)),
            audio_bos_id=int(config.get("audio_bos_token_id", 4003)),
            frame_rate=float(config.get("frame_rate", 12.5)),
            max_positions=int(config.get("max_position_embeddings", 8192)),
            num_flow_steps=int(generation.get("num_flow_steps") or 1),
            eos_threshold=float(generation.get("eos_threshold", -4.0)),
            min_frames_before_eos=int(generation.get("min_frames_before_eos", 6)),
            sampling=SamplingParams(temperature=temperature, top_k=0),
        )
    except (KeyError, TypeError, ValueError, ZeroDivisionError) as exc:
        if isinstance(exc, CheckpointError):
            raise
        raise CheckpointError(f"{directory}: invalid Pocket TTS config: {exc!r}") from exc
    if flow_head.latent_dim != latent_dim or flow_head.condition_dim != hidden:
        raise CheckpointError(
            f"{directory}: the flow head's latent_dim and condition_dim must be the model's"
        )
    if max(spec.placeholder_ids) >= spec.vocab_size or spec.num_flow_steps < 1:
        raise CheckpointError(f"{directory}: audio ids outside the vocabulary, or no flow steps")
    return spec


def _generation(directory: Path) -> dict[str, Any]:
    path = directory / "generation_config.json"
    return read_json(path) if path.exists() else {}


def paged_shape(directory: Path, config: ConfigJson) -> LlamaBackboneConfig:
    return pocket_tts_spec(directory, config).backbone


def load_pocket_tts(
    directory: Path, config: ConfigJson, device: torch.device, dtype: torch.dtype
) -> PocketTTSModel:
    spec = pocket_tts_spec(directory, config)
    prompts = load_prompts(directory, spec)
    presets = load_voice_presets(directory, spec.latent_dim)
    with torch.device("meta"):
        model = PocketTTSModel(spec, prompts, audio_tokenizer_reference(directory), presets)
    state = {
        key: tensor
        for key, tensor in load_weights(directory).items()
        if not key.startswith(_TRAINING_ONLY)
    }
    flow = model.flow_head
    for i, embedding in enumerate(flow.timestep_embeddings):
        key = f"flow_head.timestep_embeddings.{i}.freqs"
        if key not in state:  # a buffer some exports leave out: it follows from the config
            assert isinstance(embedding, TimestepEmbedding)
            state[key] = TimestepEmbedding(spec.flow_head).to("cpu").freqs
    try:
        model.load_state_dict(state, strict=True, assign=True)
    except RuntimeError as exc:
        raise CheckpointError(f"{directory}: weights do not fit the config: {exc}") from exc
    backbone = spec.backbone
    model.model.rotary = RotaryEmbedding(backbone.head_dim, backbone.rope_theta)
    # The statistics and the flow times stay float32 whatever the model's dtype, as in the
    # reference.
    kept = {key: state[key].float() for key in state if key.endswith(_FLOAT32_BUFFERS)}
    model = model.to(device=device, dtype=dtype).eval()
    for key, tensor in kept.items():
        owner, _, name = key.rpartition(".")
        setattr(model.get_submodule(owner) if owner else model, name, tensor.to(device))
    model.layout = model.latent_layout()
    return model


FAMILY = ModelFamily(
    name="pocket_tts",
    summary="Kyutai Pocket TTS (kyutai/pocket-tts): a causal transformer and a flow head "
    "sampling continuous latents of its audio tokenizer, 12.5 frames a second",
    recognises=is_pocket_tts,
    load=load_pocket_tts,
    paged_backbone=paged_shape,
    fused_cpu_step=False,
)
