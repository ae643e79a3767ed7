"""Swapping a model's linear layers for specialised ones (prepacked, quantized), in place."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn


def swap_linears(module: nn.Module, make: Callable[[torch.Tensor], nn.Module]) -> int:
    """Replace every bias-free ``nn.Linear`` under ``module`` by ``make(its weight)``; returns
    how many. Layers with a bias are left alone."""
    count = 0
    for name, child in list(module.named_children()):
        if isinstance(child, nn.Linear) and child.bias is None:
            setattr(module, name, make(child.weight))
            count += 1
        else:
            count += swap_linears(child, make)
    return count
