"""Model names and how to build them: the table of families
(:class:`~cadenza.engine.models.family.ModelFamily`) and the built-in models that need no
files. A directory (or a hub id found in the local hub cache) is loaded by the first family in
:data:`FAMILIES` that recognises it. Every model leaves here ready to serve
(:mod:`~cadenza.engine.models.serving_weights`).

Adding a family is its module (how it is recognised, loaded and shaped; its capabilities) and
one line in :data:`FAMILIES` (docs/architecture.md, "Model families", shows such a diff).
Outside ``cadenza/engine/models/`` a family is reached only through this module (beside the
interfaces, ``model`` and ``family``): an import-linter contract in ``pyproject.toml`` forbids
importing a family's module, and ``tests/unit/test_family_names.py`` forbids branching on a
family's name. So this module re-exports :class:`CheckpointError`, what a load raises.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from cadenza.engine.models import (
    csm_checkpoint,
    dia_checkpoint,
    llama_checkpoint,
    musicgen_checkpoint,
    orpheus,
    pocket_tts_checkpoint,
)
from cadenza.engine.models.bark import bark_family
from cadenza.engine.models.cadenza_tiny import MODEL_NAME as CADENZA_TINY
from cadenza.engine.models.cadenza_tiny import CadenzaTinyModel, CadenzaTinySpec
from cadenza.engine.models.checkpoint import CheckpointError as CheckpointError
from cadenza.engine.models.checkpoint import read_json
from cadenza.engine.models.family import ModelFamily, PagedShape
from cadenza.engine.models.llama import LlamaBackbone
from cadenza.engine.models.model import AudioTokenModel
from cadenza.engine.models.serving_weights import prepare_for_serving
from cadenza.hub_cache import resolve_checkpoint

FAMILIES: tuple[ModelFamily, ...] = (
    csm_checkpoint.FAMILY,
    orpheus.FAMILY,  # before llama: an Orpheus checkpoint is a Llama one too
    llama_checkpoint.FAMILY,
    dia_checkpoint.FAMILY,
    musicgen_checkpoint.FAMILY,
    pocket_tts_checkpoint.FAMILY,
    bark_family.FAMILY,
)
"""Asked in order; the first that recognises a checkpoint loads it."""


class UnknownModelError(ValueError):
    """The name is neither built in nor a directory."""


BUILT_IN_MODELS = (CADENZA_TINY,)

NAIVE_BASELINE_MODEL = CADENZA_TINY
"""The one model the naive baseline serves (``cadenza serve --engine naive``)."""


@dataclass(frozen=True)
class NaiveBaselineModel:
    """:data:`NAIVE_BASELINE_MODEL` and the parts of it the naive baseline runs itself, on
    ``transformers``' ``LlamaModel``: ``backbone`` (its shape in ``.config``, its weights in
    ``.state_dict()``), ``embed_codebooks`` (a row's embedding is the sum of
    ``embed_codebooks[k]`` of its ids in column ``k``) and ``heads`` (a position's hidden
    state to its ``K`` codebooks' logits, fused: ``[S, K * vocab]``). ``model`` is the same
    model as the batching engine serves: its layout, prompts, voices and codec."""

    model: AudioTokenModel
    backbone: LlamaBackbone
    embed_codebooks: nn.ModuleList
    heads: nn.Linear


def naive_baseline_model(seed: int) -> NaiveBaselineModel:
    """:data:`NAIVE_BASELINE_MODEL` built from ``seed`` (the weights :func:`load_model` builds
    from the same seed), on the CPU in float32, not prepared for serving."""
    model = CadenzaTinyModel.from_seed(seed)
    return NaiveBaselineModel(model, model.backbone, model.embed_codebooks, model.heads)


def family_of(directory: Path) -> ModelFamily:
    """The family that recognises the checkpoint in ``directory``; :class:`CheckpointError`
    naming the supported ones when none does."""
    config = read_json(directory / "config.json")
    for family in FAMILIES:
        if family.recognises(directory, config):
            return family
    names = ", ".join(family.name for family in FAMILIES)
    raise CheckpointError(
        f"{directory}: model_type {config.get('model_type')!r} is not supported (families: {names})"
    )


def load_checkpoint(directory: Path, device: torch.device, dtype: torch.dtype) -> AudioTokenModel:
    """The checkpoint in ``directory``, loaded by its family (not yet prepared for serving)."""
    config = read_json(directory / "config.json")
    return family_of(directory).load(directory, config, device, dtype)


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
    cached, or :class:`CheckpointError` for a directory it cannot load.
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


def paged_backbone_config(name_or_path: str) -> PagedShape:
    """The shape of the KV that is paged, without reading weights (``cadenza plan``): a
    built-in model's, or a checkpoint's from its ``config.json`` by its family."""
    if name_or_path == CADENZA_TINY:
        return CadenzaTinySpec().backbone
    directory = _checkpoint_directory(name_or_path)
    config = read_json(directory / "config.json")
    return family_of(directory).paged_backbone(directory, config)


def stream_state_bytes(name_or_path: str, dtype: torch.dtype) -> int:
    """The most bytes one stream's per-stream state takes in ``dtype`` (0: the model keeps
    none), without reading weights (``cadenza plan``)."""
    if name_or_path == CADENZA_TINY:
        return 0
    directory = _checkpoint_directory(name_or_path)
    family = family_of(directory)
    if family.stream_state is None:
        return 0
    return family.stream_state(directory, read_json(directory / "config.json"), dtype)


def _checkpoint_directory(name_or_path: str) -> Path:
    directory = resolve_checkpoint(name_or_path, ("config.json",))
    if directory is None:
        raise UnknownModelError(f"unknown model {name_or_path!r}: no config.json found")
    return directory


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
