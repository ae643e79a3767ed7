"""MusicGen checkpoints as the hub publishes them (``facebook/musicgen-small``, the
``transformers`` layout): ``config.json`` (``model_type = "musicgen"`` with ``text_encoder``
(T5), ``audio_encoder`` (EnCodec) and ``decoder`` sub-configs), ``generation_config.json``
(guidance scale, sampling), ``model.safetensors`` (the text encoder, the projection, the
decoder and the EnCodec under ``audio_encoder.``) and the T5 tokenizer's ``tokenizer.json``.
The EnCodec inside is the codec: the model names the directory itself as its codec.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch

from cadenza.contract.sampling import SamplingParams
from cadenza.engine.models.checkpoint import CheckpointError, load_weights, read_json, text_encoder
from cadenza.engine.models.family import ConfigJson, ModelFamily, PagedLayers
from cadenza.engine.models.musicgen import MusicgenDecoderSpec, MusicgenModel, MusicgenSpec
from cadenza.engine.models.t5_encoder import ACTIVATIONS, T5EncoderSpec

DEFAULT_MAX_TEXT_TOKENS = 512  # t5-base's n_positions and its tokenizer's model_max_length
_LARGEST_SANE_LENGTH = 1_000_000  # tokenizers write 1e30 for "no limit"
_IGNORED_PREFIXES = ("audio_encoder.",)  # the codec's weights, loaded by the codec
_DEFAULT_TOP_K = 50  # transformers' GenerationConfig default, where the file names none
_TIED_EMBEDDING = "text_encoder.encoder.embed_tokens.weight"  # older files: a copy of `shared`


def is_musicgen(directory: Path, config: ConfigJson) -> bool:
    return config.get("model_type") == "musicgen"


def musicgen_spec(directory: Path, config: ConfigJson) -> MusicgenSpec:
    """The checkpoint's shape and generation constants; :class:`CheckpointError` naming what
    is wrong or unsupported (stereo checkpoints among them). The defaults are
    ``generation_config.json``'s (the hub's: guidance 3.0, sampling with top-k 250), or
    ``transformers``' own without one (greedy, unguided)."""
    try:
        text = T5EncoderSpec.from_config(_object(config, "text_encoder"))
        decoder_config = _object(config, "decoder")
        decoder = MusicgenDecoderSpec(
            hidden_size=int(decoder_config["hidden_size"]),
            num_layers=int(decoder_config["num_hidden_layers"]),
            num_heads=int(decoder_config["num_attention_heads"]),
            ffn_dim=int(decoder_config["ffn_dim"]),
            num_codebooks=int(decoder_config["num_codebooks"]),
            vocab_size=int(decoder_config["vocab_size"]),
            activation=str(decoder_config.get("activation_function", "gelu")),
        )
        audio = _object(config, "audio_encoder")
        hop = math.prod(int(r) for r in audio.get("upsampling_ratios") or (8, 5, 4, 4))
        frame_rate = int(audio.get("sampling_rate") or 32000) / hop
        channels = int(decoder_config.get("audio_channels", 1))
        cross_width = decoder_config.get("cross_attention_hidden_size")
        generation = _generation(directory)
        pad_id = _generation_id(generation, decoder_config, "pad_token_id", decoder.vocab_size)
        start_id = _generation_id(generation, decoder_config, "decoder_start_token_id", pad_id)
        scale = generation.get("guidance_scale")
        sampling = SamplingParams(
            temperature=(
                float(generation.get("temperature") or 1.0) if generation.get("do_sample") else 0.0
            ),
            top_k=int(generation.get("top_k", _DEFAULT_TOP_K) or 0),
            top_p=float(generation.get("top_p") or 1.0),
        )
        spec = MusicgenSpec(
            text_encoder=text,
            decoder=decoder,
            projects=text.d_model != decoder.hidden_size and cross_width is None,
            pad_id=pad_id,
            max_text_tokens=_max_text_tokens(directory, _object(config, "text_encoder")),
            guidance_scale=None if scale is None else float(scale),
            sampling=sampling,
            default_duration_s=_default_frames(generation, decoder.num_codebooks) / frame_rate,
        )
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise CheckpointError(f"{directory}: invalid MusicGen config: {exc!r}") from exc
    if channels != 1:
        raise CheckpointError(
            f"{directory}: stereo MusicGen (audio_channels {channels}) is not supported"
        )
    if not spec.projects and text.d_model != decoder.hidden_size:
        raise CheckpointError(
            f"{directory}: cross_attention_hidden_size without a projection is not supported"
        )
    if decoder.activation not in ACTIVATIONS:
        raise CheckpointError(f"{directory}: activation {decoder.activation!r} is not supported")
    if decoder.hidden_size % decoder.num_heads:
        raise CheckpointError(f"{directory}: hidden_size must be a multiple of the heads")
    if not spec.pad_id == start_id == decoder.vocab_size:
        raise CheckpointError(
            f"{directory}: the pad and decoder start ids ({spec.pad_id}, {start_id}) must both "
            f"be the codebook size {decoder.vocab_size}"
        )
    return spec


def _default_frames(generation: dict[str, Any], num_codebooks: int) -> int:
    """Frames ``generate`` makes without ``max_new_tokens``: ``max_length`` (1,500 on the
    hub's checkpoints; ``transformers``' default 20 without one) less the start row and the
    delay pattern's tail."""
    max_length = int(generation.get("max_length") or 20)
    return max(max_length - 1 - (num_codebooks - 1), 1)


def _object(config: ConfigJson, key: str) -> dict[str, Any]:
    value = config[key]
    if not isinstance(value, dict):
        raise TypeError(f"{key} must be an object")
    return value


def _generation(directory: Path) -> dict[str, Any]:
    path = directory / "generation_config.json"
    return read_json(path) if path.exists() else {}


def _generation_id(
    generation: dict[str, Any], decoder_config: dict[str, Any], name: str, default: int
) -> int:
    value = generation.get(name, decoder_config.get(name))
    return default if value is None else int(value)


def _max_text_tokens(directory: Path, text_config: dict[str, Any]) -> int:
    """The longest description a stream may have: the T5's ``n_positions``, else the
    tokenizer's ``model_max_length``, else :data:`DEFAULT_MAX_TEXT_TOKENS`."""
    candidates: list[Any] = [text_config.get("n_positions")]
    path = directory / "tokenizer_config.json"
    if path.exists():
        candidates.append(read_json(path).get("model_max_length"))
    for value in candidates:
        if isinstance(value, (int, float)) and 0 < value <= _LARGEST_SANE_LENGTH:
            return int(value)
    return DEFAULT_MAX_TEXT_TOKENS


def paged_shape(directory: Path, config: ConfigJson) -> PagedLayers:
    spec = musicgen_spec(directory, config)
    kv = spec.kv_spec
    return PagedLayers(kv.num_layers, kv.num_kv_heads, kv.head_dim, spec.decoder.num_heads)


def state_bytes_per_stream(directory: Path, config: ConfigJson, dtype: torch.dtype) -> int:
    return musicgen_spec(directory, config).state_bytes_per_stream(dtype)


def load_musicgen(
    directory: Path, config: ConfigJson, device: torch.device, dtype: torch.dtype
) -> MusicgenModel:
    spec = musicgen_spec(directory, config)
    if not (directory / "tokenizer.json").exists():
        raise CheckpointError(f"{directory}: no tokenizer.json (the T5 tokenizer)")
    tokenizer = text_encoder(directory, "tokenizer", add_special_tokens=True)
    with torch.device("meta"):
        model = MusicgenModel(spec, tokenizer, codec_name=str(directory))
    state = {
        key: tensor
        for key, tensor in load_weights(directory).items()
        if not key.startswith(_IGNORED_PREFIXES)
    }
    tied = state.pop(_TIED_EMBEDDING, None)
    if tied is not None:
        state.setdefault("text_encoder.shared.weight", tied)
    try:
        model.load_state_dict(state, strict=True, assign=True)
    except RuntimeError as exc:
        raise CheckpointError(f"{directory}: weights do not fit the config: {exc}") from exc
    return model.to(device=device, dtype=dtype).eval()


FAMILY = ModelFamily(
    name="musicgen",
    summary="MusicGen (facebook/musicgen-small): a T5 text encoder and a guided decoder "
    "writing EnCodec 32 kHz codes in a delay pattern",
    recognises=is_musicgen,
    load=load_musicgen,
    paged_backbone=paged_shape,
    fused_cpu_step=False,
    stream_state=state_bytes_per_stream,
)
