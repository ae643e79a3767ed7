"""Model names and how to build them: built-in names need no files; directories are
checkpoints (``engine/models/checkpoint.py``)."""

from __future__ import annotations

from pathlib import Path

import torch

from cadenza.engine.models.cadenza_tiny import MODEL_NAME as CADENZA_TINY
from cadenza.engine.models.cadenza_tiny import CadenzaTinyModel
from cadenza.engine.models.checkpoint import load_checkpoint
from cadenza.engine.models.model import AudioTokenModel


class UnknownModelError(ValueError):
    """The name is neither built in nor a directory."""


BUILT_IN_MODELS = (CADENZA_TINY,)


def load_model(
    name_or_path: str, *, seed: int, device: torch.device, dtype: torch.dtype
) -> AudioTokenModel:
    """Build a built-in model from ``seed`` or load a checkpoint directory.

    Raises :class:`UnknownModelError`, or ``CheckpointError`` for a directory it cannot load.
    """
    if name_or_path == CADENZA_TINY:
        return CadenzaTinyModel.from_seed(seed).to(device=device, dtype=dtype)
    if Path(name_or_path).is_dir():
        return load_checkpoint(name_or_path, device, dtype)
    raise UnknownModelError(
        f"unknown model {name_or_path!r}: not a built-in name ({', '.join(BUILT_IN_MODELS)}) "
        "nor a local checkpoint directory"
    )
