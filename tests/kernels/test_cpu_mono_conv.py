"""The native one-output-channel conv against torch's conv1d: float32 to rounding, bfloat16
input to its own rounding, any dilation and length (at every instruction-set level,
``isa_level``); layouts and shapes it does not take are left to the caller."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from cadenza.kernels import cpu_mono_conv
from cadenza.kernels.cpu_mono_conv import MonoConv
from cadenza.kernels.native import loader

needs_kernel = pytest.mark.skipif(
    loader.load(cpu_mono_conv.LIBRARY) is None, reason="no C++ compiler on this machine"
)


def _time_major(batch: int, channels: int, length: int, dtype: torch.dtype) -> torch.Tensor:
    generator = torch.Generator().manual_seed(length)
    return torch.randn(batch, length, channels, generator=generator).to(dtype).transpose(1, 2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("kernel", "dilation", "length"), [(7, 1, 50), (3, 2, 9), (7, 1, 7)])
def test_matches_conv1d(dtype, kernel, dilation, length, isa_level):
    weight = torch.randn(1, 32, kernel)
    bias = torch.randn(1)
    conv = MonoConv.build(weight, bias, dilation)
    assert conv is not None
    x = _time_major(3, 32, length, dtype)
    assert conv.applies(x)
    got = conv(x)
    want = F.conv1d(x.double(), weight.double(), bias.double(), dilation=dilation)
    assert got.dtype == dtype and got.shape == want.shape
    tolerance = 1e-5 if dtype == torch.float32 else 2**-8 * want.abs().max().item()
    torch.testing.assert_close(got.double(), want, atol=tolerance, rtol=0)


@needs_kernel
def test_an_input_shorter_than_the_kernel_gives_no_output():
    conv = MonoConv.build(torch.randn(1, 16, 7), None)
    assert conv is not None
    assert conv(_time_major(2, 16, 6, torch.float32)).shape == (2, 1, 0)
    assert conv(_time_major(0, 16, 9, torch.float32)).shape == (0, 1, 3)


@needs_kernel
def test_what_the_kernel_does_not_take():
    assert MonoConv.build(torch.randn(2, 32, 7), None) is None  # two outputs
    assert MonoConv.build(torch.randn(1, 24, 7), None) is None  # channels % 16
    conv = MonoConv.build(torch.randn(1, 32, 7), None)
    assert conv is not None
    channel_major = torch.randn(2, 32, 20)
    assert not conv.applies(channel_major)
    assert not conv.applies(_time_major(2, 32, 20, torch.float16))
    assert not conv.applies(_time_major(2, 16, 20, torch.float32))
    for garbage in (channel_major, _time_major(2, 16, 20, torch.float32), torch.zeros(3, 32)):
        with pytest.raises(ValueError, match="time-major"):
            conv(garbage)
