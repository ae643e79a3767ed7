"""Model names and how to build them: built-in names need no files; directories (or hub ids
found in the local hub cache) are checkpoints (:mod:`~cadenza.engine.models.checkpoint`).
Every model leaves here ready to serve (:mod:`~cadenza.engine.models.serving_weights`)."""

from __future__ import annotations

import hashlib

import torch

from cadenza.engine.models.cadenza_tiny import MODEL_NAME as CADENZA_TINY
from cadenza.engine.models.cadenza_tiny import CadenzaTinyModel
from cadenza.engine.models.checkpoint import load_checkpoint
from cadenza.engine.models.model import AudioTokenModel
from cadenza.engine.models.serving_weights import prepare_for_serving
from cadenza.hub_cache import resolve_checkpoint


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
    cpu_linear_dtype: torch.dtype = torch.float32,
    fused_cpu_decode: bool = True,
) -> AudioTokenModel:
    """Build a built-in model from ``seed`` or load a checkpoint (a directory, or a hub id
    in the local hub cache), ready to serve.

    Raises :class:`UnknownModelError`, ``NotInHubCache`` for a hub id whose files are not
    cached, or ``CheckpointError`` for a directory it cannot load.
    """
    model: AudioTokenModel
    if name_or_path == CADENZA_TINY:
        model = CadenzaTinyModel.from_seed(seed).to(device=device, dtype=dtype)
    elif (directory := resolve_checkpoint(name_or_path, ("config.json",))) is not None:
        model = load_checkpoint(directory, device, dtype)
    else:
        raise UnknownModelError(
            f"unknown model {name_or_path!r}: not a built-in name ({', '.join(BUILT_IN_MODELS)}), "
            "a local checkpoint directory nor a hub id (owner/name)"
        )
    prepare_for_serving(
        model,
        weights_dtype=weights_dtype,
        pack_cpu_weights=pack_cpu_weights,
        cpu_linear_dtype=cpu_linear_dtype,
        fused_cpu_decode=fused_cpu_decode,
    )
    return model


def checkpoint_identity(name_or_path: str) -> str:
    """What tells this model's weights apart (prefix-cache and calibration keys): a built-in
    name as is; a checkpoint by its config and the names, sizes and times of its weight files
    (a hub snapshot's directory name is its revision)."""
    directory = resolve_checkpoint(name_or_path)
    if directory is None:
        return name_or_path
    digest = hashlib.sha256()
    config = directory / "config.json"
    if config.exists():
        digest.update(config.read_bytes())
    for path in sorted(directory.glob("*.safetensors")):
        stat = path.stat()
        digest.update(f"{path.name}:{stat.st_size}:{stat.st_mtime_ns}".encode())
    return f"{directory.name}@{digest.hexdigest()[:16]}"
