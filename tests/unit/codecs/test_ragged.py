import pytest
import torch
import torch.nn.functional as F

from cadenza.codecs.ragged import (
    GEMM_MIN_CHANNELS,
    Conv,
    cat_time,
    gather_windows,
    pad_batch,
    time_major,
    zeros,
)


def _is_time_major(x: torch.Tensor) -> bool:
    return x.transpose(1, 2).is_contiguous()


@pytest.mark.parametrize(
    ("in_channels", "out_channels", "kernel", "dilation", "stride", "groups"),
    [
        (8, 6, 3, 1, 1, 1),  # a 2-D conv over channels-last storage
        (8, 8, 7, 3, 1, 8),  # depthwise, dilated
        (8, 4, 4, 1, 2, 2),  # strided, grouped
        (GEMM_MIN_CHANNELS, 5, 3, 2, 1, 1),  # the matrix product, dilated
        (GEMM_MIN_CHANNELS, 7, 1, 1, 1, 1),  # the matrix product, pointwise
    ],
)
@pytest.mark.parametrize("layout", ["channel-major", "time-major"])
def test_conv_matches_conv1d_in_either_layout(
    in_channels, out_channels, kernel, dilation, stride, groups, layout
):
    torch.manual_seed(0)
    weight = torch.randn(out_channels, in_channels // groups, kernel)
    bias = torch.randn(out_channels)
    x = torch.randn(3, in_channels, 40)
    if layout == "time-major":
        x = time_major(x)
    expected = F.conv1d(x, weight, bias, stride=stride, dilation=dilation, groups=groups)
    conv = Conv(weight, bias, stride=stride, dilation=dilation, groups=groups)
    out = conv(x)
    assert conv.out_channels == out_channels
    assert _is_time_major(out)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-4)


def test_conv_without_bias_as_a_product():
    weight = torch.randn(3, GEMM_MIN_CHANNELS, 2)
    x = torch.randn(2, GEMM_MIN_CHANNELS, 9)
    torch.testing.assert_close(Conv(weight, None)(x), F.conv1d(x, weight), rtol=1e-5, atol=1e-4)


def test_helpers_keep_values_and_return_time_major():
    torch.manual_seed(1)
    a, b = torch.randn(2, 4, 3), time_major(torch.randn(2, 4, 5))
    joined = cat_time([a, b])
    assert _is_time_major(joined)
    assert torch.equal(joined, torch.cat([a, b], dim=-1))
    starts = torch.tensor([1, 4])
    windows = gather_windows(joined, starts, 3)
    assert _is_time_major(windows)
    assert torch.equal(windows[0], joined[0, :, 1:4]) and torch.equal(windows[1], joined[1, :, 4:7])
    padded = pad_batch([torch.ones(4, 2), torch.ones(4, 5)], 4, a)
    assert _is_time_major(padded) and padded.shape == (2, 4, 5)
    assert padded[0, :, 2:].abs().sum() == 0 and padded[1].sum() == 20
    empty = zeros(2, 4, 0, a)
    assert empty.shape == (2, 4, 0)
    assert time_major(b) is b  # already time-major: no copy
