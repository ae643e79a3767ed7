"""Prepacked CPU linears: fp32 equals ``F.linear`` to rounding; bf16 is within bf16's rounding
of it; ``auto`` picks bf16 exactly where the CPU multiplies bf16 natively."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from cadenza.kernels.cpu_linear import (
    PackedLinear,
    native_bf16_matmul,
    pack_linears,
    packing_available,
    resolve_cpu_linear_dtype,
)

pytestmark = pytest.mark.skipif(
    not packing_available(torch.device("cpu"), torch.float32), reason="no oneDNN packing"
)


@pytest.mark.parametrize("rows", [1, 16, 33])
def test_fp32_packing_changes_nothing_but_rounding(rows: int) -> None:
    weight = torch.randn(96, 64)
    x = torch.randn(rows, 64)
    torch.testing.assert_close(PackedLinear(weight)(x), F.linear(x, weight))


@pytest.mark.parametrize("rows", [1, 16, 33])
def test_bf16_packing_is_within_bf16_rounding_and_returns_float32(rows: int) -> None:
    weight = torch.randn(96, 64)
    x = torch.randn(2, rows, 64)
    out = PackedLinear(weight, torch.bfloat16)(x)
    expected = F.linear(x, weight)
    assert out.dtype == torch.float32 and out.shape == expected.shape
    relative = (out - expected).norm() / expected.norm()
    assert relative < 1e-2  # bf16 keeps 8 bits of mantissa: about 0.4 % per rounding


def test_pack_linears_swaps_bias_free_layers_only() -> None:
    model = nn.Sequential(nn.Linear(8, 8, bias=False), nn.Linear(8, 8), nn.Linear(8, 4, bias=False))
    assert pack_linears(model, torch.bfloat16) == 2
    assert isinstance(model[0], PackedLinear) and model[0].compute_dtype == torch.bfloat16
    assert isinstance(model[1], nn.Linear)


def test_auto_is_bf16_exactly_where_the_cpu_has_native_bf16_units() -> None:
    expected = torch.bfloat16 if native_bf16_matmul() else torch.float32
    assert resolve_cpu_linear_dtype("auto") == expected
    assert resolve_cpu_linear_dtype("float32") == torch.float32
    assert resolve_cpu_linear_dtype("bfloat16") == torch.bfloat16
