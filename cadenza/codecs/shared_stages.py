"""Streaming stages more than one convolutional codec decoder has.

EnCodec's and Mimi's SEANet: ELU, identity, and the residual block ``shortcut(x) + block(x)``;
and the plain weight of a convolution whose weight normalisation was folded at load.

SNAC's and DAC's non-causal decoders (centred, zero-padded convs): :class:`CentredConv`,
:class:`TransposedConv` and :class:`Pointwise`, each a :class:`DelayedStage`. A centred conv
with padding ``p`` is streamed as a *causal conv plus a fixed delay*: its output lags its input
by ``p`` samples, so the stage drops its first ``p`` outputs (they would be positions before
the stream's start) and, when a stream ends, feeds ``p`` zeros after its last input (the
offline right padding). Concatenating a stream's outputs (its last chunk marked final) equals
the offline layer applied to the whole input, to float rounding, for any chunking.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils import parametrize

from cadenza.codecs.codec import CodecError
from cadenza.codecs.ragged import (
    Conv,
    Lengths,
    RaggedStage,
    cat_time,
    gather_windows,
    zero_padding,
    zeros,
)
from cadenza.codecs.slot_batch import SlotBatch
from cadenza.kernels import cpu_elu
from cadenza.kernels.host_upload import upload


def plain_weight(module: nn.Module) -> torch.Tensor:
    """``module``'s effective weight; :class:`CodecError` if weight normalisation is still a
    parametrization (the codec loaders fold it)."""
    if parametrize.is_parametrized(module, "weight"):
        raise CodecError("fold weight normalisation before streaming (the codec loaders do)")
    weight = module.weight
    assert isinstance(weight, torch.Tensor)
    return weight.detach()


class Elu(RaggedStage):
    """ELU through :func:`cadenza.kernels.cpu_elu.elu` (a native kernel on the CPU, several
    times torch's speed there; ``F.elu`` elsewhere)."""

    def __init__(self, layer: nn.ELU, inplace: bool) -> None:
        self.alpha = layer.alpha
        self.inplace = inplace  # only where no other branch reads the input

    def forward(
        self, x: torch.Tensor, lengths: Lengths, slots: SlotBatch, final: list[bool]
    ) -> tuple[torch.Tensor, Lengths]:
        return cpu_elu.elu(x, self.alpha, inplace=self.inplace), lengths


class Identity(RaggedStage):
    def forward(
        self, x: torch.Tensor, lengths: Lengths, slots: SlotBatch, final: list[bool]
    ) -> tuple[torch.Tensor, Lengths]:
        return x, lengths


class Residual(RaggedStage):
    """``shortcut(x) + block(x)``, both branches keeping every row's length in step. The
    block's first stage must not work in place (the shortcut reads the same input)."""

    def __init__(self, block: list[RaggedStage], shortcut: RaggedStage) -> None:
        self.block = block
        self.shortcut = shortcut

    def reset(self, slot: int) -> None:
        for stage in [*self.block, self.shortcut]:
            stage.reset(slot)

    def forward(
        self, x: torch.Tensor, lengths: Lengths, slots: SlotBatch, final: list[bool]
    ) -> tuple[torch.Tensor, Lengths]:
        if x.shape[-1] == 0:
            return x, lengths
        h, block_lengths = x, lengths
        for stage in self.block:
            h, block_lengths = stage.forward(h, block_lengths, slots, final)
        skip, skip_lengths = self.shortcut.forward(x, lengths, slots, final)
        if block_lengths != skip_lengths:
            raise CodecError("residual branches fell out of step")
        return add_into_fresh(h, skip[:, :, : h.shape[-1]], x), skip_lengths


def add_into_fresh(h: torch.Tensor, skip: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """``h + skip``, written into ``h`` when ``h`` is a branch's own new tensor (not sharing
    storage with the stage input ``x`` nor with ``skip``): a fresh tensor of a decoder's size
    costs more to allocate than the addition itself."""
    storage = h.untyped_storage().data_ptr()
    if storage in (x.untyped_storage().data_ptr(), skip.untyped_storage().data_ptr()):
        return h + skip
    return h.add_(skip)


class DelayedStage(RaggedStage):
    """A stage of a non-causal decoder streamed with a fixed delay (SNAC, DAC)."""

    @property
    def delay(self) -> float:
        """How far this stage's output lags its input, in its output's samples."""
        return 0.0


def _extend_final(
    x: torch.Tensor, lengths: Lengths, final: list[bool], extra: int
) -> tuple[torch.Tensor, Lengths]:
    """Append ``extra`` zero samples to every final row (the offline right padding)."""
    if extra == 0 or not any(final):
        return x, lengths
    new_lengths = [n + extra * f for n, f in zip(lengths, final, strict=True)]
    x = zero_padding(x, lengths)
    return F.pad(x, (0, max(new_lengths) - x.shape[-1])), new_lengths


def _drop_leading(
    x: torch.Tensor, lengths: Lengths, to_drop: list[int], slot_ids: list[int]
) -> tuple[torch.Tensor, Lengths]:
    """Drop each row's first outputs while its slot still has some to drop."""
    drops = [min(to_drop[slot], n) for slot, n in zip(slot_ids, lengths, strict=True)]
    if not any(drops):
        return x, lengths
    for slot, drop in zip(slot_ids, drops, strict=True):
        to_drop[slot] -= drop
    new_lengths = [n - d for n, d in zip(lengths, drops, strict=True)]
    width = max(new_lengths)
    padded = F.pad(x, (0, max(drops)))
    starts = upload(drops, torch.long, x.device)
    return gather_windows(padded, starts, width), new_lengths


class Pointwise(DelayedStage):
    """A layer that looks at one time step at a time: a 1x1 ``nn.Conv1d`` (computed by
    :class:`~cadenza.codecs.ragged.Conv`, time-major), or any other such module applied as it
    is (SNAC's Snake, tanh). Holds nothing back and carries no state; every input sample yields
    one output sample, equal to the offline layer's. Delay 0."""

    def __init__(self, layer: nn.Module) -> None:
        self.layer = layer
        self.conv = (
            Conv(layer.weight, layer.bias, groups=layer.groups)
            if isinstance(layer, nn.Conv1d)
            else None
        )

    def forward(
        self, x: torch.Tensor, lengths: Lengths, slots: SlotBatch, final: list[bool]
    ) -> tuple[torch.Tensor, Lengths]:
        if self.conv is None:
            return self.layer(x), lengths
        if x.shape[-1] == 0:  # torch refuses empty convs: shape the empty output by hand
            return x.new_zeros(x.shape[0], self.conv.out_channels, 0), lengths
        return self.conv(x), lengths


class CentredConv(DelayedStage):
    """A centred stride-1 conv (``conv``: kernel ``k``, dilation ``d``, zero padding
    ``delay = (k - 1) * d / 2`` each side), or with ``conv=None`` a pure delay line of
    ``delay`` samples (a residual skip path kept in step with its branch), made causal.

    Per slot it carries the last ``2 * delay`` inputs (``delay`` for a delay line) and the
    outputs still to drop. It drops a stream's first ``delay`` outputs and holds back its last
    ``delay``, which need the inputs after them; a final chunk feeds ``delay`` zeros, the
    offline right padding, and so emits them. A stream's outputs, concatenated, equal the
    offline conv of its whole input (the input itself, for a delay line), one output sample per
    input sample, to float rounding."""

    def __init__(self, conv: nn.Conv1d | None, channels: int, delay: int, max_streams: int):
        self.conv = (
            None
            if conv is None
            else Conv(conv.weight, conv.bias, dilation=conv.dilation[0], groups=conv.groups)
        )
        self._delay = delay
        self.history_len = 2 * delay if conv is not None else delay
        like = conv.weight if conv is not None else torch.zeros(0)
        self.history = zeros(max_streams, channels, self.history_len, like)
        self.to_drop = [delay] * max_streams

    @property
    def delay(self) -> float:
        return float(self._delay)

    def reset(self, slot: int) -> None:
        self.history[slot] = 0
        self.to_drop[slot] = self._delay

    def forward(
        self, x: torch.Tensor, lengths: Lengths, slots: SlotBatch, final: list[bool]
    ) -> tuple[torch.Tensor, Lengths]:
        x, lengths = _extend_final(x, lengths, final, self._delay)
        if max(lengths, default=0) == 0:
            return x[:, :, :0] if self.conv is None else self._empty(x), lengths
        full = cat_time([self.history[slots.index], x])
        out = full[:, :, : x.shape[-1]] if self.conv is None else self.conv(full)
        self.history[slots.index] = gather_windows(
            full, upload(lengths, torch.long, x.device), self.history_len
        )
        return _drop_leading(out, lengths, self.to_drop, slots.ids)

    def _empty(self, x: torch.Tensor) -> torch.Tensor:
        assert self.conv is not None
        return x.new_zeros(x.shape[0], self.conv.out_channels, 0)


class TransposedConv(DelayedStage):
    """A transposed conv of kernel ``2 * stride`` and ``2 * padding - output_padding ==
    stride`` (SNAC's and DAC's upsamplers; :class:`CodecError` for any other), streamed with a
    delay of ``padding`` output samples. Each input frame yields ``stride`` output samples.

    It is computed polyphase: output block ``t`` (``stride`` samples) is
    ``W[:, :, :s] · x[t] + W[:, :, s:] · x[t - 1]``, one width-2 conv whose ``stride * C_out``
    channels (phase-major) a reshape of time-major storage interleaves into time. Offline the
    output starts ``padding`` samples into that sequence and ends ``padding`` samples into the
    block after the last input's. So per slot it carries the previous input frame and the
    samples still to drop: it drops a stream's first ``padding`` samples and holds back the
    block's last ``padding``; a final chunk feeds one zero frame, of whose block only the first
    ``padding`` samples are emitted. A stream's outputs, concatenated, equal the offline
    transposed conv of its whole input, to float rounding."""

    def __init__(self, conv: nn.ConvTranspose1d, max_streams: int) -> None:
        weight = conv.weight.detach()  # [C_in, C_out, k]
        self.stride = stride = conv.stride[0]
        padding = conv.padding
        assert isinstance(padding, tuple)  # a transposed conv's padding is never a string
        self.padding: int = padding[0]
        output_padding = conv.output_padding[0]
        if conv.kernel_size[0] != 2 * stride or 2 * self.padding - output_padding != stride:
            raise CodecError("streaming expects transposed convs with kernel 2x stride")
        in_channels, self.out_channels = weight.shape[0], weight.shape[1]
        taps = torch.stack([weight[:, :, stride:], weight[:, :, :stride]], dim=-1)
        assert conv.bias is not None
        # -> [stride * C_out, C_in, 2], channel (r, o) = r * C_out + o
        phase_major = taps.permute(2, 1, 0, 3).reshape(-1, in_channels, 2)
        self.conv = Conv(phase_major, conv.bias.detach().repeat(stride))
        self.history = zeros(max_streams, in_channels, 1, weight)
        self.to_drop = [self.padding] * max_streams

    @property
    def delay(self) -> float:
        return float(self.padding)

    def reset(self, slot: int) -> None:
        self.history[slot] = 0
        self.to_drop[slot] = self.padding

    def forward(
        self, x: torch.Tensor, lengths: Lengths, slots: SlotBatch, final: list[bool]
    ) -> tuple[torch.Tensor, Lengths]:
        x, lengths = _extend_final(x, lengths, final, 1)
        batch, _, steps = x.shape
        if max(lengths, default=0) == 0:
            return x.new_zeros(batch, self.out_channels, 0), lengths
        full = cat_time([self.history[slots.index], x])
        phases = self.conv(full)  # [B, stride * C_out, T], time-major
        self.history[slots.index] = gather_windows(full, upload(lengths, torch.long, x.device), 1)
        out = phases.transpose(1, 2).reshape(batch, steps * self.stride, self.out_channels)
        out = out.transpose(1, 2)
        # A final row's extra zero frame contributes only its first ``padding`` samples.
        tail = self.stride - self.padding
        out_lengths = [n * self.stride - tail * f for n, f in zip(lengths, final, strict=True)]
        return _drop_leading(out, out_lengths, self.to_drop, slots.ids)
