"""Reading a local Hugging Face-format checkpoint directory (``config.json`` and safetensors):
what every family's loader shares. Which family a directory holds, and how it is built, is the
registry's and the family's (:mod:`~cadenza.engine.models.registry`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

from cadenza.engine.models.llama import Llama3RopeScaling, LlamaBackboneConfig
from cadenza.engine.models.prompt_format import TextEncoder


class CheckpointError(ValueError):
    """The directory is not a checkpoint this version can load; the message says why."""


def llama_backbone_config(
    config: dict[str, Any], directory: Path, default_theta: float = 10000.0
) -> LlamaBackboneConfig:
    """A Llama decoder's shape from a ``config.json`` (a Llama's, or a CSM's backbone or depth
    decoder). Raises :class:`CheckpointError` naming what is unsupported or invalid."""
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


def text_encoder(directory: Path, kind: str, add_special_tokens: bool) -> TextEncoder:
    """UTF-8 bytes (``kind = "bytes"``) or the checkpoint's ``tokenizer.json``."""
    if kind == "bytes":
        return lambda text: list(text.encode("utf-8"))
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(directory / "tokenizer.json"))
    return lambda text: list(tokenizer.encode(text, add_special_tokens=add_special_tokens).ids)


def load_weights(directory: Path) -> dict[str, torch.Tensor]:
    """Every tensor of ``model.safetensors`` or of the shards its index names."""
    single = directory / "model.safetensors"
    if single.exists():
        return load_file(str(single))
    index_path = directory / "model.safetensors.index.json"
    if not index_path.exists():
        raise CheckpointError(f"{directory}: no model.safetensors or model.safetensors.index.json")
    shards = sorted(set(read_json(index_path)["weight_map"].values()))
    state: dict[str, torch.Tensor] = {}
    for shard in shards:
        state.update(load_file(str(directory / shard)))
    return state


def named_audio_tokenizer(directory: Path) -> str | None:
    """The codec a checkpoint's processor names (a directory or a hub id): in
    ``audio_tokenizer_config.json`` (the hub's files) or the ``audio_tokenizer`` entry of
    ``processor_config.json`` (as ``transformers`` 5 saves a processor); ``None`` when neither
    names one. :class:`CheckpointError` for an entry without a name."""
    path = directory / "audio_tokenizer_config.json"
    if path.exists():
        entry: Any = read_json(path)
    else:
        path = directory / "processor_config.json"
        entry = read_json(path).get("audio_tokenizer") if path.exists() else None
        if entry is None:
            return None
    name = entry.get("audio_tokenizer_name_or_path") if isinstance(entry, dict) else None
    if not isinstance(name, str) or not name:
        raise CheckpointError(f"{path}: audio_tokenizer_name_or_path must name the codec")
    return name


def read_json(path: Path) -> dict[str, Any]:
    """A JSON object from ``path``; :class:`CheckpointError` when missing or not an object."""
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError as exc:
        raise CheckpointError(f"{path} not found") from exc
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"{path} is not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise CheckpointError(f"{path} must hold a JSON object")
    return data
