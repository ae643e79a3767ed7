"""Linear layers with weights prepacked for oneDNN, the fast path for fp32 on the CPU.

A plain ``F.linear`` on the CPU goes through MKL with the weight in its checkpoint layout; for
the small row counts of a decode step (1-64 tokens) that reaches a fraction of the machine's
bandwidth. Reordering the weight once into oneDNN's blocked layout (what ``torch.compile``
does on CPU) makes the same product 2-4x faster at batch 1-16 on the development machine
(docs/benchmarks.md). :func:`pack_linears` swaps every bias-free ``nn.Linear`` of a model for
:class:`PackedLinear`; outputs agree with ``F.linear`` to float rounding.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from cadenza.kernels.linear_swap import swap_linears


def packing_available(device: torch.device, dtype: torch.dtype) -> bool:
    """oneDNN packing applies to fp32 weights on a CPU build that has the ops."""
    return (
        device.type == "cpu"
        and dtype == torch.float32
        and torch.backends.mkldnn.is_available()  # type: ignore[no-untyped-call]
        and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
    )


class PackedLinear(nn.Module):
    """``y = x @ weight.T`` with ``weight`` kept for reference and a packed copy for compute."""

    packed: torch.Tensor

    def __init__(self, weight: torch.Tensor) -> None:
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.weight = nn.Parameter(weight.detach(), requires_grad=False)
        self.register_buffer(
            "packed",
            torch.ops.mkldnn._reorder_linear_weight(self.weight.detach()),
            persistent=False,
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype != torch.float32 or x.device.type != "cpu":
            return F.linear(x, self.weight)
        flat = x.reshape(-1, self.in_features)
        out = torch.ops.mkldnn._linear_pointwise(flat, self.packed, None, "none", [], "")
        return out.reshape(*x.shape[:-1], self.out_features)


def pack_linears(module: nn.Module) -> int:
    """Replace every bias-free ``nn.Linear`` under ``module`` in place; returns how many."""
    return swap_linears(module, PackedLinear)
