"""A stack of LSTM layers over a ragged batch on the CPU through a native kernel: the LSTM of
a streaming codec decoder (EnCodec's), each stream with its own state.

torch's CPU LSTM reorders its weights on every call (oneDNN's RNN for a uniform batch) or runs
a ragged, packed batch one step and one product at a time; at a streaming decoder's call sizes
(a few streams of a few to fifteen frames) that is most of the layer's time.
``native/cpu_lstm.cpp`` runs a layer in one call over weights packed once, the rows of a ragged
batch each for its own length (longest first), with float32 state.

:meth:`NativeLstm.build` returns ``None`` where the kernel does not apply (no C++ compiler, a
bidirectional or projected LSTM, a weight dtype other than float32 or bfloat16, a hidden size
that is not a multiple of 16): callers keep ``torch.nn.LSTM``.
"""

from __future__ import annotations

import ctypes

import torch
from torch import nn

from cadenza.kernels.native import loader
from cadenza.kernels.packed_product import BLOCK, pack_weight

LIBRARY = "cpu_lstm"
_ENTRY_POINTS = {torch.float32: "cadenza_lstm_layer_f32", torch.bfloat16: "cadenza_lstm_layer_bf16"}


def unsupported_reason(lstm: nn.LSTM, dtype: torch.dtype) -> str | None:
    """Why the kernel cannot run ``lstm`` with ``dtype`` weights (``None``: it can)."""
    if dtype not in _ENTRY_POINTS:
        return f"weights in {dtype}"
    if lstm.bidirectional or lstm.proj_size or not lstm.bias or lstm.batch_first:
        return "a bidirectional, projected, bias-free or batch-first LSTM"
    if lstm.hidden_size % BLOCK:
        return f"hidden size {lstm.hidden_size} is not a multiple of {BLOCK}"
    if lstm.input_size % 2:
        return f"input size {lstm.input_size} is odd"
    return None


class NativeLstm:
    """``lstm``'s layers packed for ``cpu_lstm.cpp`` in ``dtype`` (float32 or bfloat16), run
    by ``library`` (as :func:`~cadenza.kernels.native.loader.load` gives it)."""

    def __init__(self, lstm: nn.LSTM, dtype: torch.dtype, library: ctypes.CDLL) -> None:
        self.num_layers = lstm.num_layers
        self.hidden_size = lstm.hidden_size
        self.input_size = lstm.input_size
        self.dtype = dtype
        pairs = dtype == torch.bfloat16 and bool(library.cadenza_lstm_weight_pairs())
        self._layer = getattr(library, _ENTRY_POINTS[dtype])
        self._weights: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []
        for layer in range(self.num_layers):
            w_ih = getattr(lstm, f"weight_ih_l{layer}").detach()
            w_hh = getattr(lstm, f"weight_hh_l{layer}").detach()
            bias = getattr(lstm, f"bias_ih_l{layer}") + getattr(lstm, f"bias_hh_l{layer}")
            self._weights.append(
                (
                    pack_weight(w_ih.float(), dtype, pairs),
                    pack_weight(w_hh.float(), dtype, pairs),
                    bias.detach().float().contiguous(),
                )
            )

    @classmethod
    def build(cls, lstm: nn.LSTM, dtype: torch.dtype) -> NativeLstm | None:
        """The packed stack, or ``None`` where the kernel does not apply (see the module)."""
        if unsupported_reason(lstm, dtype) is not None:
            return None
        library = loader.load(LIBRARY)
        return None if library is None else cls(lstm, dtype, library)

    def __call__(
        self, x: torch.Tensor, lengths: list[int], h: torch.Tensor, c: torch.Tensor
    ) -> torch.Tensor:
        """Run every layer over ``x [B, T, input_size]`` (float32, contiguous), row ``b`` for
        its first ``lengths[b]`` steps from state ``h, c [num_layers, B, hidden]`` (float32,
        contiguous; replaced by each row's state after its last step). Returns the last
        layer's output ``[B, T, hidden]`` float32, zeros past each row's length."""
        batch, steps, _ = x.shape
        if x.dtype != torch.float32 or not x.is_contiguous() or x.shape[2] != self.input_size:
            raise ValueError("x must be contiguous float32 [B, T, input_size]")
        expected = (self.num_layers, batch, self.hidden_size)
        for state in (h, c):
            if state.shape != expected or state.dtype != torch.float32:
                raise ValueError(f"state must be float32 {list(expected)}")
            if not state.is_contiguous():
                raise ValueError("state must be contiguous")
        if len(lengths) != batch or any(not 0 <= n <= steps for n in lengths):
            raise ValueError(f"lengths must be {batch} counts in [0, {steps}]")
        rows = torch.tensor(lengths, dtype=torch.int32)
        layer_input = x
        for layer, (w_ih, w_hh, bias) in enumerate(self._weights):
            out = torch.empty(batch, steps, self.hidden_size)
            if batch and steps:
                self._layer(
                    layer_input.data_ptr(),
                    batch,
                    steps,
                    rows.data_ptr(),
                    layer_input.shape[2],
                    self.hidden_size,
                    w_ih.data_ptr(),
                    w_hh.data_ptr(),
                    bias.data_ptr(),
                    h[layer].data_ptr(),
                    c[layer].data_ptr(),
                    out.data_ptr(),
                )
            else:
                out.zero_()
            layer_input = out
        return layer_input
