"""Weight normalisation: the names checkpoints store it under, and folding it into plain
weights at load (same outputs, no per-call recomputation).

A weight-normalised layer's two tensors have two spellings. ``torch.nn.utils.weight_norm``
(and so most checkpoints published on the Hugging Face hub: suno/bark's codec,
facebook/encodec_24khz, hubertsiuzdak/snac_24khz) saved ``<prefix>.weight_g`` (the norm) and
``<prefix>.weight_v`` (the direction); ``torch.nn.utils.parametrizations.weight_norm``, which
today's torch and ``transformers`` use and save, names them
``<prefix>.parametrizations.weight.original0`` and ``original1``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypeVar

from torch import nn
from torch.nn.utils import parametrize

_TensorT = TypeVar("_TensorT")

# Legacy last name component -> the parametrisation's names after the same prefix.
_PARAMETRIZED_NAMES = {
    "weight_g": "parametrizations.weight.original0",
    "weight_v": "parametrizations.weight.original1",
}


def parametrized_weight_norm_names(state: Mapping[str, _TensorT]) -> dict[str, _TensorT]:
    """``state`` with every legacy weight-norm name mapped to the parametrisation's:
    ``<prefix>.weight_g`` -> ``<prefix>.parametrizations.weight.original0``, ``<prefix>.weight_v``
    -> ``<prefix>.parametrizations.weight.original1`` (a bare ``weight_g`` / ``weight_v`` too).
    Every other name, new-style ones included, is kept as it is, so a mixture of both styles
    comes out in the new one; the tensors are the same objects, in the same order.

    Raises :class:`ValueError` when one tensor is named both ways (which to load would be a
    guess).
    """
    renamed: dict[str, _TensorT] = {}
    for name, tensor in state.items():
        prefix, dot, last = name.rpartition(".")
        if last in _PARAMETRIZED_NAMES:
            new_name = prefix + dot + _PARAMETRIZED_NAMES[last]
            if new_name in state:
                raise ValueError(f"weight norm named both ways: {name} and {new_name}")
            name = new_name
        renamed[name] = tensor
    return renamed


def fold_weight_norm(model: nn.Module) -> int:
    """Replace weight-norm parametrisations by the plain weights they compute; returns how
    many were folded."""
    folded = 0
    for module in model.modules():
        if parametrize.is_parametrized(module, "weight"):
            parametrize.remove_parametrizations(module, "weight", leave_parametrized=True)
            folded += 1
    return folded
