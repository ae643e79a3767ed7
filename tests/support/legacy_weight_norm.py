"""Checkpoints with weight norm under its legacy names, as the Hugging Face hub's files hold it
(suno/bark, facebook/encodec_24khz, hubertsiuzdak/snac_24khz): ``<prefix>.weight_g`` /
``<prefix>.weight_v`` where today's torch and ``transformers`` save
``<prefix>.parametrizations.weight.original0`` / ``original1``."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TypeVar

from safetensors import safe_open
from safetensors.torch import save_file

_TensorT = TypeVar("_TensorT")

_LEGACY_SUFFIXES = {
    ".parametrizations.weight.original0": ".weight_g",
    ".parametrizations.weight.original1": ".weight_v",
}


def legacy_weight_norm_names(
    state: Mapping[str, _TensorT], which: Callable[[str], bool] = lambda name: True
) -> dict[str, _TensorT]:
    """``state`` with the weight-norm tensors of the names ``which`` picks renamed to the legacy
    names (the others kept: ``which`` makes a mixture of both styles); nothing else renamed."""
    renamed: dict[str, _TensorT] = {}
    for name, tensor in state.items():
        for new, legacy in _LEGACY_SUFFIXES.items():
            if name.endswith(new) and which(name):
                name = name.removesuffix(new) + legacy
        renamed[name] = tensor
    return renamed


def resave_with_legacy_weight_norm_names(
    path: Path, which: Callable[[str], bool] = lambda name: True
) -> int:
    """Rewrite the safetensors file ``path`` with :func:`legacy_weight_norm_names` (its metadata
    kept); returns how many tensors were renamed."""
    with safe_open(path, "pt") as handle:
        metadata = handle.metadata()
        state = {name: handle.get_tensor(name) for name in handle.keys()}  # noqa: SIM118
    renamed = legacy_weight_norm_names(state, which)
    save_file(renamed, path, metadata=metadata)
    return len(set(renamed) - set(state))
