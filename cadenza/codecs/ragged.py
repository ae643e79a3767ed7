"""Ragged batches for streaming decoders: row ``b`` of a ``[B, C, T]`` tensor holds
``lengths[b]`` valid time steps, the rest is padding whose values mean nothing.

The decoders keep these tensors *time-major*: ``[B, C, T]`` views of ``[B, T, C]`` storage (the
channels-last layout of a 1-row image). A CPU's oneDNN convolves that layout 1.3-20x faster than
channel-major storage (the high-rate, few-channel convs of a codec decoder most; measured in
docs/journal/2026-12-01-sampling-by-threshold-codecs-time-major.md), and elementwise ops keep
it. ``torch.cat`` and ``gather`` do not, so the helpers here, and :class:`Conv`, return
time-major tensors. Any layout gives the same values: layout is only speed.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from cadenza.codecs.slot_batch import SlotBatch
from cadenza.kernels.cpu_mono_conv import MonoConv
from cadenza.kernels.host_upload import upload

Lengths = list[int]


def time_major(x: torch.Tensor) -> torch.Tensor:
    """``x`` (``[B, C, T]``) stored time-major: ``x`` itself when it already is, else a copy."""
    storage = x.transpose(1, 2)
    return x if storage.is_contiguous() else storage.contiguous().transpose(1, 2)


def zeros(batch: int, channels: int, steps: int, like: torch.Tensor) -> torch.Tensor:
    """A time-major ``[batch, channels, steps]`` tensor of zeros, ``like``'s dtype and device."""
    return like.new_zeros(batch, steps, channels).transpose(1, 2)


def cat_time(pieces: list[torch.Tensor]) -> torch.Tensor:
    """``[B, C, T_i]`` pieces joined along time, time-major."""
    return torch.cat([piece.transpose(1, 2) for piece in pieces], dim=1).transpose(1, 2)


def pad_batch(pieces: list[torch.Tensor], channels: int, like: torch.Tensor) -> torch.Tensor:
    """``[C, n_b]`` pieces as one zero-padded, time-major ``[B, C, max n_b]`` tensor."""
    longest = max((p.shape[-1] for p in pieces), default=0)
    out = zeros(len(pieces), channels, longest, like)
    for index, piece in enumerate(pieces):
        out[index, :, : piece.shape[-1]] = piece
    return out


def gather_windows(full: torch.Tensor, starts: torch.Tensor, width: int) -> torch.Tensor:
    """``full[b, :, starts[b] : starts[b] + width]`` for every ``b``, as one time-major tensor."""
    index = starts[:, None] + torch.arange(width, device=full.device)[None, :]
    storage = full.transpose(1, 2)  # [B, T, C]
    return storage.gather(1, index[:, :, None].expand(-1, -1, full.shape[1])).transpose(1, 2)


def zero_padding(x: torch.Tensor, lengths: Lengths) -> torch.Tensor:
    """``x`` with every row's padding set to zero."""
    if all(n == x.shape[-1] for n in lengths):
        return x
    valid = (
        torch.arange(x.shape[-1], device=x.device)[None, :]
        < upload(lengths, torch.long, x.device)[:, None]
    )
    return x * valid[:, None, :]


GEMM_MIN_CHANNELS = 256  # from here on, a stride-1 conv runs as one matrix product


class Conv:
    """A 1-D convolution of time-major batches (``weight [C_out, C_in / groups, k]``); the
    output is time-major. Inputs in another layout are converted first. Every row is
    convolved whole: callers handle padding rows.

    Three ways, by shape (docs/journal/2026-12-01-sampling-by-threshold-codecs-time-major.md):
    a wide stride-1 conv (``C_in >= 256``, the low-rate end of a decoder, few time steps) is
    one matrix product of the ``k`` shifted time-major views side by side (1.5-4x oneDNN's
    convs there); a stride-1 conv to one output channel (the waveform at the decoder's end)
    goes to a native kernel on the CPU
    (:mod:`cadenza.kernels.cpu_mono_conv`); the rest run as a 2-D conv over channels-last
    storage."""

    def __init__(
        self,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        *,
        stride: int = 1,
        dilation: int = 1,
        groups: int = 1,
    ) -> None:
        weight = weight.detach()
        self.out_channels, in_per_group, self.kernel = (int(n) for n in weight.shape)
        self.bias = None if bias is None else bias.detach()
        self.stride = stride
        self.dilation = dilation
        self.groups = groups
        self.matrix: torch.Tensor | None = None  # [(tap, C_in), C_out] for the product
        self.weight: torch.Tensor | None = None  # [C_out, C_in / groups, 1, k] channels-last
        self.mono: MonoConv | None = None
        if self.out_channels == 1 and groups == 1 and stride == 1:
            self.mono = MonoConv.build(weight, bias, dilation)
        if groups == 1 and stride == 1 and in_per_group >= GEMM_MIN_CHANNELS:
            self.matrix = weight.permute(2, 1, 0).reshape(-1, self.out_channels).contiguous()
        else:
            self.weight = weight.unsqueeze(2).contiguous(memory_format=torch.channels_last)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.mono is not None:
            x = time_major(x)
            if self.mono.applies(x):
                return self.mono(x)
        if self.matrix is not None:
            return self._product(time_major(x).transpose(1, 2))
        assert self.weight is not None
        out = F.conv2d(
            time_major(x).unsqueeze(2),
            self.weight,
            self.bias,
            stride=(1, self.stride),
            dilation=(1, self.dilation),
            groups=self.groups,
        )
        return time_major(out.squeeze(2))

    def _product(self, storage: torch.Tensor) -> torch.Tensor:
        """``storage [B, T, C_in]`` -> time-major ``[B, C_out, T - (k - 1) * dilation]``."""
        assert self.matrix is not None
        batch, steps = storage.shape[0], storage.shape[1] - (self.kernel - 1) * self.dilation
        taps = [
            storage[:, j * self.dilation : j * self.dilation + steps] for j in range(self.kernel)
        ]
        columns = (taps[0] if self.kernel == 1 else torch.cat(taps, dim=-1)).reshape(
            batch * steps, -1
        )
        if self.bias is None:
            out = columns @ self.matrix
        else:
            out = torch.addmm(self.bias, columns, self.matrix)
        return out.view(batch, steps, self.out_channels).transpose(1, 2)


class RaggedStage:
    """One layer of a streaming decoder over ragged batches, with per-slot state."""

    def forward(
        self, x: torch.Tensor, lengths: Lengths, slots: SlotBatch, final: list[bool]
    ) -> tuple[torch.Tensor, Lengths]:
        """New input for the slots ``slots`` (``final``: their streams end here) -> new
        output and each row's length."""
        raise NotImplementedError

    def reset(self, slot: int) -> None:
        """Forget a slot's state (it is about to carry a new stream)."""
