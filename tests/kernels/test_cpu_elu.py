"""The native ELU against torch's: float32 to a few ulp, bfloat16 bit for bit, any dense
layout kept, in place or not (at every instruction-set level, ``isa_level``), and torch's own
ELU for whatever the kernel does not take."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from cadenza.kernels import cpu_elu


def _values(dtype: torch.dtype) -> torch.Tensor:
    generator = torch.Generator().manual_seed(0)
    spread = torch.randn(6, 37, 53, generator=generator) * 4  # odd sizes: vector tails
    finite = [0.0, -0.0, 1e-8, -1e-8, -1e-3, -0.34, -0.35, -0.5, -0.7, -20.0, -90.0, -1e30, 88.0]
    edges = torch.tensor([*finite, float("inf"), float("-inf"), float("nan")])
    spread.view(-1)[: edges.numel()] = edges
    return spread.to(dtype)


@pytest.mark.parametrize("alpha", [1.0, 0.5])
def test_float32_matches_torch_to_a_few_ulp(alpha, isa_level):
    x = _values(torch.float32)
    got = cpu_elu.elu(x, alpha)
    want = F.elu(x.double(), alpha).float()
    torch.testing.assert_close(got, want, rtol=4e-7, atol=1e-30, equal_nan=True)
    assert torch.isnan(got).sum() == 1


def test_bfloat16_matches_torch_bit_for_bit(isa_level):
    x = _values(torch.bfloat16)
    assert torch.equal(
        cpu_elu.elu(x).view(torch.int16).masked_fill(torch.isnan(x), 0),
        F.elu(x).view(torch.int16).masked_fill(torch.isnan(x), 0),
    )
    assert torch.isnan(cpu_elu.elu(x)).sum() == 1


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_time_major_tensor_keeps_its_layout_in_place_or_not(dtype, isa_level):
    x = _values(dtype).transpose(1, 2)  # [B, C, T] view of [B, T, C] storage
    want = F.elu(x)
    out = cpu_elu.elu(x)
    assert out.stride() == x.stride()
    rtol = 4e-7 if dtype == torch.float32 else 0.0
    torch.testing.assert_close(out, want, rtol=rtol, atol=0, equal_nan=True)
    pointer = x.data_ptr()
    in_place = cpu_elu.elu(x, inplace=True)
    assert in_place.data_ptr() == pointer
    torch.testing.assert_close(in_place, want, rtol=rtol, atol=0, equal_nan=True)


def test_what_the_kernel_does_not_take_goes_to_torch(monkeypatch):
    calls = []
    original = F.elu

    def spy(x, alpha=1.0, inplace=False):
        calls.append(x.dtype)
        return original(x, alpha, inplace=inplace)

    monkeypatch.setattr(cpu_elu.F, "elu", spy)
    strided = torch.randn(8, 8)[:, ::2]  # not dense
    torch.testing.assert_close(cpu_elu.elu(strided), original(strided))
    half = torch.randn(5, dtype=torch.float16)
    torch.testing.assert_close(cpu_elu.elu(half), original(half))
    grad = torch.randn(5, requires_grad=True)
    cpu_elu.elu(grad).sum().backward()
    assert grad.grad is not None
    assert calls == [torch.float32, torch.float16, torch.float32]


def test_without_a_compiler_it_is_torch(no_compiler):
    assert cpu_elu._native(torch.float32) is None
    x = _values(torch.float32)
    torch.testing.assert_close(cpu_elu.elu(x), F.elu(x), equal_nan=True)


def test_an_empty_tensor():
    assert cpu_elu.elu(torch.empty(0, 3)).shape == (0, 3)
