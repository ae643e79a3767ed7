"""Bark's family record: a ``model_type: "bark"`` checkpoint in the ``transformers`` layout
(:mod:`~cadenza.engine.models.bark.bark_checkpoint`) served by the engine as a
:class:`~cadenza.engine.models.bark.bark_model.BarkModel`, its EnCodec the codec inside the
same directory."""

from __future__ import annotations

from pathlib import Path

import torch

from cadenza.engine.models.bark.bark_checkpoint import load_bark
from cadenza.engine.models.bark.bark_constants import bark_constants
from cadenza.engine.models.bark.bark_gpt import GPTShape
from cadenza.engine.models.bark.bark_model import BarkModel
from cadenza.engine.models.bark.bark_stream import state_bytes
from cadenza.engine.models.bark.bark_voices import VoicePresetError
from cadenza.engine.models.checkpoint import CheckpointError, read_json
from cadenza.engine.models.family import ConfigJson, ModelFamily, PagedLayers


def is_bark(directory: Path, config: ConfigJson) -> bool:
    return config.get("model_type") == "bark"


def _causal_shape(directory: Path, config: ConfigJson) -> GPTShape:
    try:
        return GPTShape.from_config(config["semantic_config"])
    except (KeyError, TypeError, ValueError) as exc:
        raise CheckpointError(f"{directory}: invalid Bark semantic_config: {exc!r}") from exc


def paged_shape(directory: Path, config: ConfigJson) -> PagedLayers:
    """The semantic stage's (the coarse stage has the same shape and the same pages)."""
    shape = _causal_shape(directory, config)
    return PagedLayers(shape.num_layers, shape.num_heads, shape.head_dim, shape.num_heads)


def stream_state_bytes(directory: Path, config: ConfigJson, dtype: torch.dtype) -> int:
    """A stream's progress through the stages (int64 codes, whatever the dtype)."""
    path = directory / "generation_config.json"
    try:
        return state_bytes(bark_constants(read_json(path) if path.exists() else None))
    except ValueError as exc:
        raise CheckpointError(f"{directory}: {exc}") from exc


def load_bark_model(
    directory: Path, config: ConfigJson, device: torch.device, dtype: torch.dtype
) -> BarkModel:
    try:
        return BarkModel(load_bark(directory, device, dtype), codec_name=str(directory))
    except (VoicePresetError, ValueError) as exc:
        if isinstance(exc, CheckpointError):
            raise
        raise CheckpointError(f"{directory}: {exc}") from exc


FAMILY = ModelFamily(
    name="bark",
    summary="Bark (suno/bark, suno/bark-small): text to semantic tokens, semantic to EnCodec's "
    "first two codebooks in sliding windows, a non-causal stage filling in the other six",
    recognises=is_bark,
    load=load_bark_model,
    paged_backbone=paged_shape,
    fused_cpu_step=False,
    stream_state=stream_state_bytes,
)
