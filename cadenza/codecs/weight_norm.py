"""Weight normalisation folded into plain weights: same outputs, no per-call recomputation."""

from __future__ import annotations

from torch import nn
from torch.nn.utils import parametrize


def fold_weight_norm(model: nn.Module) -> int:
    """Replace weight-norm parametrisations by the plain weights they compute; returns how
    many were folded."""
    folded = 0
    for module in model.modules():
        if parametrize.is_parametrized(module, "weight"):
            parametrize.remove_parametrizations(module, "weight", leave_parametrized=True)
            folded += 1
    return folded
