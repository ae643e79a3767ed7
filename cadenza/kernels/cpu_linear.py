"""Linear layers with weights prepacked for oneDNN, the fast path for fp32 on the CPU.

A plain ``F.linear`` on the CPU goes through MKL with the weight in its checkpoint layout; for
the small row counts of a decode step (1-64 tokens) that reaches a fraction of the machine's
bandwidth. Reordering the weight once into oneDNN's blocked layout (what ``torch.compile``
does on CPU) makes the same product 2-4x faster at batch 1-16 on the development machine
(docs/benchmarks.md). :func:`pack_linears` swaps every bias-free ``nn.Linear`` of a model for
:class:`PackedLinear`; outputs agree with ``F.linear`` to float rounding.

On a CPU with native bf16 matrix units (AMX tiles or AVX512-BF16,
:func:`native_bf16_matmul`), the packed weight can be bf16 instead: the product then runs on
those units, 2.5-4x faster again at 16-32 rows, with bf16's rounding of weights and
activations (the input is rounded to bf16, accumulation and the output stay fp32). What that
costs in accuracy is measured in docs/benchmarks.md ("CPU bf16 matrix units").
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from cadenza.kernels.linear_swap import swap_linears


def native_bf16_matmul() -> bool:
    """Whether this CPU multiplies bf16 in hardware (AMX tiles or AVX512-BF16), where oneDNN's
    bf16 products beat fp32 ones; without them bf16 is emulated and slower."""
    probes = ("_is_amx_tile_supported", "_is_avx512_bf16_supported")
    return any(bool(getattr(torch.cpu, name, lambda: False)()) for name in probes)


def resolve_cpu_linear_dtype(setting: str) -> torch.dtype:
    """``engine.cpu_linear_dtype`` as a dtype: ``auto`` is bf16 where
    :func:`native_bf16_matmul`, else fp32."""
    if setting == "auto":
        return torch.bfloat16 if native_bf16_matmul() else torch.float32
    return {"float32": torch.float32, "bfloat16": torch.bfloat16}[setting]


def packing_available(device: torch.device, dtype: torch.dtype) -> bool:
    """oneDNN packing applies to fp32 weights on a CPU build that has the ops."""
    return (
        device.type == "cpu"
        and dtype == torch.float32
        and torch.backends.mkldnn.is_available()  # type: ignore[no-untyped-call]
        and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
    )


# A oneDNN call costs 30-40 us however small the product (2 cores); below about this many
# multiply-adds plain ``F.linear`` (MKL, fp32) is as fast or faster (docs/benchmarks.md).
SMALL_PRODUCT_MACS = 2_500_000


class PackedLinear(nn.Module):
    """``y = x @ weight.T`` with ``weight`` kept for reference and a packed copy for compute,
    in ``compute_dtype`` (fp32, or bf16 for the CPU's bf16 units); fp32 in, fp32 out.

    Products smaller than :data:`SMALL_PRODUCT_MACS` (few rows through a small layer) use the
    fp32 ``weight`` directly: oneDNN's fixed cost per call would dominate them. With bf16 that
    makes a row's result depend, to bf16 rounding, on how many rows share the call."""

    packed: torch.Tensor

    def __init__(self, weight: torch.Tensor, compute_dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.compute_dtype = compute_dtype
        self.weight = nn.Parameter(weight.detach(), requires_grad=False)
        self.register_buffer(
            "packed",
            torch.ops.mkldnn._reorder_linear_weight(self.weight.detach().to(compute_dtype)),
            persistent=False,
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype != torch.float32 or x.device.type != "cpu":
            return F.linear(x, self.weight)
        rows = x.numel() // self.in_features
        if rows * self.in_features * self.out_features < SMALL_PRODUCT_MACS:
            return F.linear(x, self.weight)
        flat = x.reshape(-1, self.in_features).to(self.compute_dtype)
        out = torch.ops.mkldnn._linear_pointwise(flat, self.packed, None, "none", [], "")
        return out.to(torch.float32).reshape(*x.shape[:-1], self.out_features)


def pack_linears(module: nn.Module, compute_dtype: torch.dtype = torch.float32) -> int:
    """Replace every bias-free ``nn.Linear`` under ``module`` in place; returns how many."""
    return swap_linears(module, lambda weight: PackedLinear(weight, compute_dtype))
