"""The native LSTM against torch's: each row of a ragged batch for its own length, state carried
across calls, float32 to rounding and bfloat16 weights to bf16 rounding (at every
instruction-set level, ``isa_level``); garbage refused."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from cadenza.kernels import cpu_lstm
from cadenza.kernels.cpu_lstm import NativeLstm
from cadenza.kernels.native import loader

needs_kernel = pytest.mark.skipif(
    loader.load(cpu_lstm.LIBRARY) is None, reason="no C++ compiler on this machine"
)


def _lstm(input_size: int = 64, hidden: int = 48, layers: int = 2) -> nn.LSTM:
    torch.manual_seed(0)
    return nn.LSTM(input_size, hidden, layers)


def _reference(lstm: nn.LSTM, x: torch.Tensor, h: torch.Tensor, c: torch.Tensor):
    """torch's LSTM in float64 over one row ``x [T, K]`` from ``h, c [layers, hidden]``."""
    reference = _lstm(lstm.input_size, lstm.hidden_size, lstm.num_layers).double()
    reference.load_state_dict(lstm.state_dict())
    with torch.no_grad():
        out, (h_out, c_out) = reference(
            x[:, None].double(), (h[:, None].double(), c[:, None].double())
        )
    return out[:, 0].float(), h_out[:, 0].float(), c_out[:, 0].float()


@pytest.mark.parametrize(("dtype", "tolerance"), [(torch.float32, 1e-5), (torch.bfloat16, 3e-2)])
def test_ragged_rows_each_run_their_own_length(dtype, tolerance, isa_level):
    lstm = _lstm()
    native = NativeLstm.build(lstm, dtype)
    assert native is not None
    lengths = [7, 3, 0, 7, 1]
    x = torch.randn(len(lengths), 7, 64)
    h0, c0 = torch.randn(2, len(lengths), 48), torch.randn(2, len(lengths), 48)
    h, c = h0.clone(), c0.clone()
    out = native(x, lengths, h, c)
    assert out.shape == (5, 7, 48) and out.dtype == torch.float32
    for row, steps in enumerate(lengths):
        assert torch.all(out[row, steps:] == 0)
        if steps == 0:
            assert torch.equal(h[:, row], h0[:, row]) and torch.equal(c[:, row], c0[:, row])
            continue
        want, h_want, c_want = _reference(lstm, x[row, :steps], h0[:, row], c0[:, row])
        torch.testing.assert_close(out[row, :steps], want, atol=tolerance, rtol=0)
        torch.testing.assert_close(h[:, row], h_want, atol=tolerance, rtol=0)
        torch.testing.assert_close(c[:, row], c_want, atol=2 * tolerance, rtol=0)


def test_state_carries_from_call_to_call(isa_level):
    lstm = _lstm()
    native = NativeLstm.build(lstm, torch.float32)
    assert native is not None
    x = torch.randn(2, 12, 64)
    h, c = torch.zeros(2, 2, 48), torch.zeros(2, 2, 48)
    whole = native(x, [12, 12], h, c)
    h2, c2 = torch.zeros(2, 2, 48), torch.zeros(2, 2, 48)
    pieces = [
        native(x[:, a:b].contiguous(), [b - a] * 2, h2, c2) for a, b in [(0, 5), (5, 6), (6, 12)]
    ]
    torch.testing.assert_close(torch.cat(pieces, dim=1), whole, atol=1e-6, rtol=0)
    torch.testing.assert_close(h2, h, atol=1e-6, rtol=0)


@needs_kernel
def test_garbage_is_refused_with_a_reason():
    native = NativeLstm.build(_lstm(), torch.float32)
    assert native is not None
    h, c = torch.zeros(2, 2, 48), torch.zeros(2, 2, 48)
    with pytest.raises(ValueError, match="float32"):
        native(torch.zeros(2, 3, 64, dtype=torch.float64), [3, 3], h, c)
    with pytest.raises(ValueError, match="input_size"):
        native(torch.zeros(2, 3, 65), [3, 3], h, c)
    with pytest.raises(ValueError, match="lengths"):
        native(torch.zeros(2, 3, 64), [4, 3], h, c)
    with pytest.raises(ValueError, match="lengths"):
        native(torch.zeros(2, 3, 64), [3], h, c)
    with pytest.raises(ValueError, match="state"):
        native(torch.zeros(2, 3, 64), [3, 3], torch.zeros(2, 3, 48), c)
    with pytest.raises(ValueError, match="contiguous"):
        native(torch.zeros(2, 3, 64), [3, 3], torch.zeros(2, 48, 2).transpose(1, 2), c)


def test_lstms_the_kernel_does_not_take_stay_on_torch():
    assert NativeLstm.build(nn.LSTM(64, 48, bidirectional=True), torch.float32) is None
    assert NativeLstm.build(nn.LSTM(64, 40), torch.float32) is None  # hidden % 16
    assert NativeLstm.build(nn.LSTM(63, 48), torch.float32) is None  # odd input
    assert NativeLstm.build(nn.LSTM(64, 48), torch.float16) is None
    assert cpu_lstm.unsupported_reason(nn.LSTM(64, 48), torch.float32) is None
