"""Dia checkpoints as the hub publishes them (``nari-labs/Dia-1.6B-0626``, the ``transformers``
layout): ``config.json`` (``model_type = "dia"``, an encoder and a decoder config, in the form
``transformers`` 4.53 wrote or today's), ``generation_config.json`` (guidance scale, sampling),
``model.safetensors``, and ``audio_tokenizer_config.json`` naming the DAC codec
(``descript/dac_44khz``: a hub id found in the local hub cache, or a directory).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from cadenza.contract.sampling import SamplingParams
from cadenza.engine.models.checkpoint import (
    CheckpointError,
    load_weights,
    named_audio_tokenizer,
    read_json,
)
from cadenza.engine.models.dia import DiaModel, DiaSpec, DiaStackSpec
from cadenza.engine.models.family import ConfigJson, ModelFamily, PagedLayers

DEFAULT_DELAY_PATTERN = (0, 8, 9, 10, 11, 12, 13, 14, 15)
DEFAULT_CODEC = "descript/dac_44khz"


def is_dia(directory: Path, config: ConfigJson) -> bool:
    return config.get("model_type") == "dia"


def dia_spec(directory: Path, config: ConfigJson) -> DiaSpec:
    """The checkpoint's shape and generation constants; :class:`CheckpointError` naming what
    is wrong."""
    try:
        encoder = _stack(config["encoder_config"], text=True)
        decoder_config = config["decoder_config"]
        decoder = _stack(decoder_config, text=False)
        delays = tuple(int(d) for d in config.get("delay_pattern") or DEFAULT_DELAY_PATTERN)
        channels = int(decoder_config.get("num_channels", len(delays)))

        def audio_id(name: str, default: int) -> int:
            value = decoder_config.get(name, config.get(name))
            return default if value is None else int(value)

        generation = _generation(directory)
        scale = generation.get("guidance_scale", 3.0)
        spec = DiaSpec(
            encoder=encoder,
            decoder=decoder,
            cross_num_heads=int(decoder_config.get("cross_num_attention_heads", 16)),
            cross_num_kv_heads=int(decoder_config.get("cross_num_key_value_heads", 16)),
            cross_head_dim=int(decoder_config.get("cross_head_dim", 128)),
            num_channels=channels,
            delay_pattern=delays,
            bos_id=audio_id("bos_token_id", 1026),
            eos_id=audio_id("eos_token_id", 1024),
            pad_id=audio_id("pad_token_id", 1025),
            guidance_scale=None if scale is None else float(scale),
            sampling=SamplingParams(
                temperature=max(float(generation.get("temperature") or 1.0), 1.0),
                top_k=int(generation.get("top_k") or 0),
                top_p=float(generation.get("top_p") or 1.0),
            ),
        )
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise CheckpointError(f"{directory}: invalid Dia config: {exc!r}") from exc
    if len(spec.delay_pattern) != spec.num_channels:
        raise CheckpointError(f"{directory}: the delay pattern must give one delay per channel")
    if not spec.eos_id < spec.pad_id < spec.decoder.vocab_size:
        raise CheckpointError(f"{directory}: the audio ids do not fit the decoder's vocabulary")
    return spec


def _stack(config: Any, *, text: bool) -> DiaStackSpec:
    if not isinstance(config, dict):
        raise TypeError("a Dia encoder_config and decoder_config must be objects")
    rope = config.get("rope_parameters") or {}
    if rope.get("rope_type", "default") != "default" or config.get("rope_scaling"):
        raise ValueError("Dia with scaled rotary positions is not supported")
    heads = int(config.get("num_attention_heads", 16))
    return DiaStackSpec(
        hidden_size=int(config["hidden_size"]),
        num_layers=int(config["num_hidden_layers"]),
        num_heads=heads,
        num_kv_heads=int(config.get("num_key_value_heads") or heads),
        head_dim=int(config.get("head_dim", 128)),
        intermediate_size=int(config["intermediate_size"]),
        norm_eps=float(config.get("norm_eps", 1e-5)),
        rope_theta=float(rope.get("rope_theta") or config.get("rope_theta") or 10000.0),
        max_positions=int(config.get("max_position_embeddings", 1024 if text else 3072)),
        vocab_size=int(config.get("vocab_size", 256 if text else 1028)),
    )


def _generation(directory: Path) -> dict[str, Any]:
    path = directory / "generation_config.json"
    return read_json(path) if path.exists() else {}


def codec_reference(directory: Path) -> str:
    """The codec the checkpoint names (:func:`named_audio_tokenizer`), as a directory or a hub
    id for the codec registry; the public codec when it names none."""
    return named_audio_tokenizer(directory) or DEFAULT_CODEC


def paged_shape(directory: Path, config: ConfigJson) -> PagedLayers:
    spec = dia_spec(directory, config)
    return PagedLayers(
        spec.kv_spec.num_layers,
        spec.kv_spec.num_kv_heads,
        spec.kv_spec.head_dim,
        spec.decoder.num_heads,
    )


def state_bytes_per_stream(directory: Path, config: ConfigJson, dtype: torch.dtype) -> int:
    return dia_spec(directory, config).state_bytes_per_stream(dtype)


def load_dia(
    directory: Path, config: ConfigJson, device: torch.device, dtype: torch.dtype
) -> DiaModel:
    spec = dia_spec(directory, config)
    with torch.device("meta"):
        model = DiaModel(spec, codec_name=codec_reference(directory))
    state = {key: tensor for key, tensor in load_weights(directory).items()}
    try:
        model.load_state_dict(state, strict=True, assign=True)
    except RuntimeError as exc:
        raise CheckpointError(f"{directory}: weights do not fit the config: {exc}") from exc
    decoder, encoder = model.model.decoder, model.model.encoder
    decoder.embeddings.offsets = torch.arange(spec.num_channels) * spec.decoder.vocab_size
    encoder.rotary = type(encoder.rotary)(spec.encoder.head_dim, spec.encoder.rope_theta)
    decoder.rotary = type(decoder.rotary)(spec.decoder.head_dim, spec.decoder.rope_theta)
    return model.to(device=device, dtype=dtype).eval()


FAMILY = ModelFamily(
    name="dia",
    summary="Dia (nari-labs/Dia-1.6B-0626): a byte text encoder and a guided decoder "
    "speaking DAC codes in a delay pattern",
    recognises=is_dia,
    load=load_dia,
    paged_backbone=paged_shape,
    fused_cpu_step=False,
    stream_state=state_bytes_per_stream,
    takes_context=True,
)
