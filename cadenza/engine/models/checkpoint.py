"""Loading a local Hugging Face-format checkpoint directory (config.json + safetensors).

Supported: ``model_type: "llama"`` (``LlamaForCausalLM``), tied or untied embeddings, rotary
scaling ``default`` or ``llama3``, single-file or sharded safetensors; and ``model_type: "csm"``
(Sesame CSM, :mod:`~cadenza.engine.models.csm`, whose Mimi codec is in the same files). How a
Llama checkpoint's tokens spell audio comes from, in order: a ``cadenza.json`` beside
``config.json`` (a full declaration, or ``{"preset": "orpheus", ...}`` with overrides), else
recognition of a known family from the checkpoint's own files (Orpheus:
:mod:`~cadenza.engine.models.orpheus`), else none (a text LM). Anything else is refused with
a message that names what is unsupported.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from safetensors.torch import load_file

from cadenza.contract.sampling import SamplingParams
from cadenza.engine.layouts.flat import FlatLayout
from cadenza.engine.models.csm import (
    SPEAKERS,
    CsmModel,
    CsmPrompt,
    csm_sampling_defaults,
    is_csm_config,
    map_csm_key,
)
from cadenza.engine.models.llama import Llama3RopeScaling, LlamaBackboneConfig
from cadenza.engine.models.llama_causal_lm import LlamaForCausalLM
from cadenza.engine.models.model import AudioTokenModel
from cadenza.engine.models.orpheus import is_orpheus_checkpoint, orpheus_audio_config
from cadenza.engine.models.prompt_format import (
    PromptFormat,
    TemplatePrompt,
    TextEncoder,
    TokenPrompt,
)


class CheckpointError(ValueError):
    """The directory is not a checkpoint this version can load; the message says why."""


class SamplingDefaults(BaseModel):
    """A model's own sampling defaults (each unset one keeps the library's)."""

    model_config = ConfigDict(extra="forbid")

    temperature: float | None = Field(None, ge=0)
    top_k: int | None = Field(None, ge=0)
    top_p: float | None = Field(None, gt=0, le=1)
    min_p: float | None = Field(None, ge=0, lt=1)
    repetition_penalty: float | None = Field(None, gt=0)

    def params(self) -> SamplingParams:
        return SamplingParams(**self.model_dump(exclude_none=True))


class AudioLayoutConfig(BaseModel):
    """``cadenza.json``: how a Llama checkpoint's tokens spell codec frames.

    ``prompt_template`` (say ``"{voice}: {text}"``) writes voice and text into one string
    tokenized together; ``voices`` is then a list of names. Without it each voice is a list of
    token ids placed before the text."""

    model_config = ConfigDict(extra="forbid")

    family: str = "custom"
    layout: Literal["flat"]
    codec: str = "encodec_24khz"
    num_codebooks: int = Field(ge=1)
    codebook_size: int = Field(ge=2)
    audio_token_offset: int = Field(ge=0)
    audio_eos_id: int = Field(ge=0)
    frame_order: list[int] | None = None
    text_tokenizer: Literal["bytes", "tokenizer.json"] = "bytes"
    add_special_tokens: bool = False
    prompt_template: str | None = None
    prompt_prefix_ids: list[int] = []
    prompt_suffix_ids: list[int] = []
    voices: dict[str, list[int]] | list[str] = {"default": []}
    sampling: SamplingDefaults = SamplingDefaults()


def load_checkpoint(path: str | Path, device: torch.device, dtype: torch.dtype) -> AudioTokenModel:
    directory = Path(path)
    config = _read_json(directory / "config.json")
    model_type = config.get("model_type")
    if is_csm_config(config):
        return load_csm_checkpoint(directory, config, device, dtype)
    if model_type != "llama":
        raise CheckpointError(
            f"{directory}: model_type {model_type!r} is not supported (llama and csm are)"
        )
    backbone = _llama_backbone_config(config, directory)
    eos = config.get("eos_token_id")
    eos_ids = frozenset([eos] if isinstance(eos, int) else (eos or []))
    try:
        vocab_size = int(config["vocab_size"])
    except (KeyError, TypeError, ValueError) as exc:
        raise CheckpointError(f"{directory}: invalid vocab_size: {exc!r}") from exc
    tied = bool(config.get("tie_word_embeddings", False))
    layout_kwargs = _audio_layout(directory, config, vocab_size)
    with torch.device("meta"):
        model = LlamaForCausalLM(
            backbone, vocab_size, tie_word_embeddings=tied, eos_ids=eos_ids, **layout_kwargs
        )
    state = _load_weights(directory)
    state = {_map_key(key): tensor for key, tensor in state.items()}
    if tied:
        state.pop("lm_head.weight", None)
    model.load_state_dict(state, strict=not tied, assign=True)
    if tied:
        model.lm_head.weight = model.embed_tokens.weight
    missing = [n for n, p in model.named_parameters() if p.is_meta]
    if missing:
        raise CheckpointError(f"{directory}: weights missing for {missing[:5]}")
    model.model.rotary = type(model.model.rotary)(
        backbone.head_dim, backbone.rope_theta, backbone.rope_llama3
    )
    return model.to(device=device, dtype=dtype).eval()


def load_csm_checkpoint(
    directory: Path, config: dict[str, Any], device: torch.device, dtype: torch.dtype
) -> CsmModel:
    """A Sesame CSM checkpoint in the ``transformers`` layout (the codec's weights stay for
    the codec loader)."""
    depth_config = config.get("depth_decoder_config")
    if not isinstance(depth_config, dict):
        raise CheckpointError(f"{directory}: a CSM config needs a depth_decoder_config object")
    backbone = _llama_backbone_config(config, directory, default_theta=500000.0)
    depth = _llama_backbone_config(depth_config, directory, default_theta=500000.0)
    try:
        num_codebooks = int(config.get("num_codebooks") or 32)
        vocab_size = int(config.get("vocab_size") or 2051)
        text_vocab_size = int(config.get("text_vocab_size") or 128256)
        eos_code = int(config.get("codebook_eos_token_id") or 0)
        codec = config.get("codec_config") or {}
        codebook_size = int(codec.get("codebook_size", 2048))
        backbone_hidden = int(depth_config.get("backbone_hidden_size", backbone.hidden_size))
        max_positions = int(config.get("max_position_embeddings") or 2048)
    except (TypeError, ValueError, AttributeError) as exc:
        raise CheckpointError(f"{directory}: invalid CSM config: {exc!r}") from exc
    if backbone_hidden != backbone.hidden_size:
        raise CheckpointError(f"{directory}: depth decoder and backbone widths disagree")
    try:
        encode_text = _text_encoder(directory, "tokenizer.json", add_special_tokens=False)
        sampling = SamplingDefaults.model_validate(csm_sampling_defaults(directory)).params()
        with torch.device("meta"):
            model = CsmModel(
                backbone,
                depth,
                num_codebooks=num_codebooks,
                vocab_size=vocab_size,
                text_vocab_size=text_vocab_size,
                prompt=CsmPrompt(encode_text, num_codebooks, _csm_voices(directory)),
                codec_name=str(directory),
                default_sampling=sampling,
                codebook_size=codebook_size,
                eos_code=eos_code,
                max_positions=max_positions,
            )
    except (ValueError, OSError, ValidationError) as exc:
        raise CheckpointError(f"{directory}: {exc}") from exc
    state: dict[str, torch.Tensor] = {}
    for key, tensor in _load_weights(directory).items():
        mapped = map_csm_key(key)
        if mapped is not None:
            state[mapped] = tensor
    # Codebook embeddings are tied between backbone and depth decoder (transformers saves one).
    backbone_key, depth_key = "embed_audio_tokens.weight", "depth_decoder.embed_tokens.weight"
    if config.get("tie_codebooks_embeddings", True):
        if backbone_key not in state and depth_key in state:
            state[backbone_key] = state[depth_key]
        elif depth_key not in state and backbone_key in state:
            state[depth_key] = state[backbone_key]
    try:
        model.load_state_dict(state, strict=True, assign=True)
    except RuntimeError as exc:
        raise CheckpointError(f"{directory}: weights do not fit the config: {exc}") from exc
    for module, config_of in (
        (model.backbone_model, backbone),
        (model.depth_decoder.transformer, depth),
    ):
        module.rotary = type(module.rotary)(
            config_of.head_dim, config_of.rope_theta, config_of.rope_llama3
        )
    model.offsets = torch.arange(num_codebooks) * vocab_size
    model.depth_decoder.split_heads()
    model = model.to(device=device, dtype=dtype).eval()
    # .to() converts each parameter on its own: tie the codebook embeddings again.
    model.depth_decoder.embed_tokens.weight = model.embed_audio_tokens.weight
    return model


def _csm_voices(directory: Path) -> tuple[str, ...]:
    """Speaker ids: ``cadenza.json``'s ``voices`` (ids as strings) if present, else 0 and 1."""
    path = directory / "cadenza.json"
    if not path.exists():
        return SPEAKERS
    voices = _read_json(path).get("voices")
    if (
        not isinstance(voices, list)
        or not voices
        or not all(isinstance(v, str) and v.isdigit() for v in voices)
    ):
        raise CheckpointError(f'{path}: voices must be a list of speaker ids such as ["0"]')
    return tuple(voices)


def read_llama_backbone_config(directory: Path) -> LlamaBackboneConfig:
    """The shape of the backbone that holds the paged KV, from ``directory/config.json`` alone
    (no weights are read): a Llama's, or a CSM's backbone (its depth decoder's KV is a
    per-frame scratch, not paged)."""
    config = _read_json(directory / "config.json")
    if is_csm_config(config):
        return _llama_backbone_config(config, directory, default_theta=500000.0)
    if config.get("model_type") != "llama":
        raise CheckpointError(
            f"{directory}: model_type {config.get('model_type')!r} is neither llama nor csm"
        )
    return _llama_backbone_config(config, directory)


def _llama_backbone_config(
    config: dict[str, Any], directory: Path, default_theta: float = 10000.0
) -> LlamaBackboneConfig:
    for flag in ("attention_bias", "mlp_bias"):
        if config.get(flag):
            raise CheckpointError(f"{directory}: {flag} = true is not supported")
    if config.get("hidden_act", "silu") != "silu":
        raise CheckpointError(f"{directory}: hidden_act {config['hidden_act']!r} is not supported")
    try:
        rope = dict(config.get("rope_parameters") or config.get("rope_scaling") or {})
        theta = float(rope.get("rope_theta", config.get("rope_theta", default_theta)))
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        llama3 = None
        if rope_type == "llama3":
            llama3 = Llama3RopeScaling(
                factor=float(rope["factor"]),
                low_freq_factor=float(rope["low_freq_factor"]),
                high_freq_factor=float(rope["high_freq_factor"]),
                original_max_position_embeddings=int(rope["original_max_position_embeddings"]),
            )
        elif rope_type != "default":
            raise CheckpointError(f"{directory}: rope type {rope_type!r} is not supported")
        heads = int(config["num_attention_heads"])
        hidden = int(config["hidden_size"])
        return LlamaBackboneConfig(
            hidden_size=hidden,
            num_layers=int(config["num_hidden_layers"]),
            num_heads=heads,
            num_kv_heads=int(config.get("num_key_value_heads") or heads),
            head_dim=int(config.get("head_dim") or hidden // heads),
            intermediate_size=int(config["intermediate_size"]),
            rms_norm_eps=float(config.get("rms_norm_eps", 1e-6)),
            rope_theta=theta,
            rope_llama3=llama3,
        )
    except (KeyError, TypeError, ValueError, ZeroDivisionError) as exc:
        if isinstance(exc, CheckpointError):
            raise
        raise CheckpointError(f"{directory}: invalid Llama config: {exc!r}") from exc


def read_audio_layout_config(directory: Path, config: dict[str, Any]) -> AudioLayoutConfig | None:
    """The checkpoint's audio declaration (see the module docstring); ``None``: a text LM."""
    path = directory / "cadenza.json"
    declared: dict[str, Any] | None = None
    if path.exists():
        declared = _read_json(path)
        preset = declared.pop("preset", None)
        if preset == "orpheus":
            declared = {**orpheus_audio_config(directory), **declared}
        elif preset is not None:
            raise CheckpointError(f"{path}: unknown preset {preset!r} (known: orpheus)")
    elif is_orpheus_checkpoint(directory, config):
        declared = orpheus_audio_config(directory)
    if declared is None:
        return None
    try:
        return AudioLayoutConfig.model_validate(declared)
    except ValidationError as exc:
        raise CheckpointError(
            f"{path}: {exc.errors()[0]['msg']} at {exc.errors()[0]['loc']}"
        ) from exc


def _audio_layout(directory: Path, config: dict[str, Any], vocab_size: int) -> dict[str, Any]:
    layout = read_audio_layout_config(directory, config)
    if layout is None:
        return {}
    try:
        flat = FlatLayout(
            layout.num_codebooks,
            layout.codebook_size,
            layout.audio_token_offset,
            layout.audio_eos_id,
            vocab_size,
            frame_order=layout.frame_order,
        )
        encode_text = _text_encoder(directory, layout.text_tokenizer, layout.add_special_tokens)
        prompt: PromptFormat
        if layout.prompt_template is not None:
            voices = tuple(layout.voices)
            prompt = TemplatePrompt(
                encode_text,
                layout.prompt_template,
                voices,
                layout.prompt_prefix_ids,
                layout.prompt_suffix_ids,
            )
        elif isinstance(layout.voices, dict):
            prompt = TokenPrompt(
                encode_text, layout.voices, layout.prompt_prefix_ids, layout.prompt_suffix_ids
            )
        else:
            raise ValueError("voices without ids need a prompt_template")
        sampling = layout.sampling.params()
    except (ValueError, OSError) as exc:
        raise CheckpointError(f"{directory}: {exc}") from exc
    return {
        "layout": flat,
        "prompt": prompt,
        "codec_name": layout.codec,
        "family": layout.family,
        "default_sampling": sampling,
    }


def _text_encoder(directory: Path, kind: str, add_special_tokens: bool) -> TextEncoder:
    if kind == "bytes":
        return lambda text: list(text.encode("utf-8"))
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(directory / "tokenizer.json"))
    return lambda text: list(tokenizer.encode(text, add_special_tokens=add_special_tokens).ids)


def _load_weights(directory: Path) -> dict[str, torch.Tensor]:
    single = directory / "model.safetensors"
    if single.exists():
        return load_file(str(single))
    index_path = directory / "model.safetensors.index.json"
    if not index_path.exists():
        raise CheckpointError(f"{directory}: no model.safetensors or model.safetensors.index.json")
    shards = sorted(set(_read_json(index_path)["weight_map"].values()))
    state: dict[str, torch.Tensor] = {}
    for shard in shards:
        state.update(load_file(str(directory / shard)))
    return state


def _map_key(key: str) -> str:
    return key.removeprefix("model.") if key.startswith("model.embed_tokens") else key


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError as exc:
        raise CheckpointError(f"{path} not found") from exc
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"{path} is not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise CheckpointError(f"{path} must hold a JSON object")
    return data
