"""Model names and how to build them: built-in names need no files; directories are
checkpoints (:mod:`~cadenza.engine.models.checkpoint`). Every model leaves here ready to serve
(:mod:`~cadenza.engine.models.serving_weights`)."""

from __future__ import annotations

from pathlib import Path

import torch

from cadenza.engine.models.cadenza_tiny import MODEL_NAME as CADENZA_TINY
from cadenza.engine.models.cadenza_tiny import CadenzaTinyModel
from cadenza.engine.models.checkpoint import load_checkpoint
from cadenza.engine.models.model import AudioTokenModel
from cadenza.engine.models.serving_weights import prepare_for_serving


class UnknownModelError(ValueError):
    """The name is neither built in nor a directory."""


BUILT_IN_MODELS = (CADENZA_TINY,)


def load_model(
    name_or_path: str,
    *,
    seed: int,
    device: torch.device,
    dtype: torch.dtype,
    weights_dtype: str = "auto",
    pack_cpu_weights: bool = True,
) -> AudioTokenModel:
    """Build a built-in model from ``seed`` or load a checkpoint directory, ready to serve.

    Raises :class:`UnknownModelError`, or ``CheckpointError`` for a directory it cannot load.
    """
    model: AudioTokenModel
    if name_or_path == CADENZA_TINY:
        model = CadenzaTinyModel.from_seed(seed).to(device=device, dtype=dtype)
    elif Path(name_or_path).is_dir():
        model = load_checkpoint(name_or_path, device, dtype)
    else:
        raise UnknownModelError(
            f"unknown model {name_or_path!r}: not a built-in name ({', '.join(BUILT_IN_MODELS)}) "
            "nor a local checkpoint directory"
        )
    prepare_for_serving(model, weights_dtype=weights_dtype, pack_cpu_weights=pack_cpu_weights)
    return model
