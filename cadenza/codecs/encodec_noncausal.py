"""The non-causal EnCodec decoder (``use_causal_conv: false``, MusicGen's 32 kHz model): how its
layers pad and trim, how far its audio lags its codes, and its streaming stages.

Offline, with ``p = (k - 1) * dilation``, a conv pads ``left = p - p // 2`` samples before its
input and ``right = p // 2`` after it, by the config's ``pad_mode`` (``reflect`` in every
published model: the samples next to the edge, mirrored); a transposed conv of stride ``r``
(kernel ``2r``) cuts ``r - r // 2`` samples off the start of its output and ``r // 2`` off the
end. (A causal config pads ``p`` on the left only and cuts ``ceil(r * trim_right_ratio)`` off
the end, the rest off the start.) Streamed, each layer is a causal computation followed by a
fixed delay, per slot:

=====================  =====================================================================
stage                  carried state
=====================  =====================================================================
padded conv            the last ``p`` samples of its padded input and the outputs still to
                       drop (``right``: they would precede the stream). Until a stream has
                       more than ``left`` samples it is buffered (its first ``left + 1``
                       samples make the left padding). When the stream ends, the right padding
                       is made from its last samples; a whole stream of at most ``left``
                       samples is padded as the offline layer pads it (zero-extended, then
                       reflected).
transposed conv        the previous input frame (polyphase, as in the causal decoder) and the
                       samples still to cut at the start; when the stream ends, one zero frame
                       gives the samples the offline layer keeps after the last frame's block.
residual skip path     a delay line as long as the block's delay (its conv's ``right``)
LSTM, ELU              as in the causal decoder (:mod:`~cadenza.codecs.encodec_streaming`)
=====================  =====================================================================

Every stage delays by exactly what the offline layer looks ahead, so the delays add up to the
decoder's receptive field: :func:`lookahead_samples` (MusicGen's 32 kHz model: 2,402 samples,
sample ``n`` depends on frames up to ``(n + 2402) // 640``). Decoding a prefix of a code
sequence is *not* a prefix of the full decode (the last ``lookahead_samples`` differ: the end
is reflected); streaming holds those samples back until the next codes or the end arrive.
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from transformers.models.encodec.modeling_encodec import EncodecConv1d

from cadenza.codecs.codec import CodecError
from cadenza.codecs.ragged import (
    Conv,
    Lengths,
    RaggedStage,
    cat_time,
    gather_windows,
    pad_batch,
    zero_padding,
    zeros,
)
from cadenza.codecs.shared_stages import add_into_fresh, plain_weight
from cadenza.codecs.slot_batch import SlotBatch
from cadenza.kernels.host_upload import upload

PAD_MODES = ("reflect", "replicate", "constant")
"""The ``pad_mode`` values a streamed conv can reproduce (``circular`` reads the far end)."""


def conv_padding(layer: Any) -> tuple[int, int]:
    """The samples an ``EncodecConv1d`` of stride 1 pads before and after its input."""
    conv = layer.conv
    total = (conv.kernel_size[0] - 1) * conv.dilation[0]
    if layer.causal:
        return total, 0
    return total - total // 2, total // 2


def transposed_trim(layer: Any) -> tuple[int, int]:
    """The samples an ``EncodecConvTranspose1d`` cuts off the start and the end of its
    output."""
    conv = layer.conv
    total = conv.kernel_size[0] - conv.stride[0]
    right = math.ceil(total * layer.trim_right_ratio) if layer.causal else total // 2
    return total - right, right


def lookahead_samples(model: Any) -> int:
    """How many output samples an EnCodec ``model``'s decoder looks ahead: sample ``n``
    depends on the frames up to ``(n + lookahead) // hop_length``, no later. 0 for a causal
    model trimming its transposed convs on the right (the 24 kHz one), 2,402 for MusicGen's
    32 kHz model."""
    rate = 1  # output samples per frame, up to the layer at hand
    latency = Fraction(0)  # in frames
    for layer in model.decoder.layers:
        kind = type(layer).__name__
        if kind == "EncodecConvTranspose1d":
            rate *= layer.conv.stride[0]
            latency += Fraction(transposed_trim(layer)[0], rate)
        elif kind == "EncodecConv1d":
            latency += Fraction(conv_padding(layer)[1], rate)
        elif kind == "EncodecResnetBlock":
            convs = [sub for sub in layer.block if type(sub).__name__ == "EncodecConv1d"]
            latency += Fraction(sum(conv_padding(sub)[1] for sub in convs), rate)
    return math.ceil(latency * rate)


class LaggingStage(RaggedStage):
    """A stage whose output lags its input by :attr:`delay` samples (of its output): what the
    offline layer looks ahead."""

    delay = 0


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
    padded = F.pad(x, (0, max(drops)))
    starts = upload(drops, torch.long, x.device)
    return gather_windows(padded, starts, max(new_lengths)), new_lengths


def _append(
    x: torch.Tensor, lengths: Lengths, tails: list[torch.Tensor | None]
) -> tuple[torch.Tensor, Lengths]:
    """Each row's valid samples followed by its tail (``None``: nothing), as one batch."""
    if all(tail is None for tail in tails):
        return x, lengths
    pieces = [
        x[row, :, :n] if tail is None else torch.cat([x[row, :, :n], tail], dim=-1)
        for row, (n, tail) in enumerate(zip(lengths, tails, strict=True))
    ]
    return pad_batch(pieces, x.shape[1], x), [piece.shape[-1] for piece in pieces]


class PaddedConv(LaggingStage):
    """A stride-1 ``EncodecConv1d`` of a non-causal model (see the module docstring)."""

    def __init__(self, layer: Any, max_streams: int, dtype: torch.dtype) -> None:
        conv: nn.Conv1d = layer.conv
        if conv.stride[0] != 1:
            raise CodecError("streaming decode supports stride-1 convolutions only")
        if layer.pad_mode not in PAD_MODES:
            raise CodecError(f"streaming decode cannot pad with {layer.pad_mode!r}")
        weight = plain_weight(conv).to(dtype)
        assert conv.bias is not None
        self.conv = Conv(weight, conv.bias.detach().to(dtype), dilation=conv.dilation[0])
        self.pad_mode: str = layer.pad_mode
        self.left, self.right = conv_padding(layer)
        self.delay = self.right
        self.width = self.left + self.right  # history: the last inputs the next output reads
        self.in_channels = conv.in_channels
        self.history = zeros(max_streams, self.in_channels, self.width, weight)
        self.started = [False] * max_streams
        self.pending: dict[int, torch.Tensor] = {}
        self.to_drop = [self.right] * max_streams

    def reset(self, slot: int) -> None:
        self.history[slot] = 0
        self.started[slot] = False
        self.pending.pop(slot, None)
        self.to_drop[slot] = self.right

    def forward(
        self, x: torch.Tensor, lengths: Lengths, slots: SlotBatch, final: list[bool]
    ) -> tuple[torch.Tensor, Lengths]:
        slot_ids = slots.ids
        padded_end = [False] * len(slot_ids)
        if not all(self.started[s] for s in slot_ids):
            x, lengths, padded_end = self._start_slots(x, lengths, slot_ids, final)
        ending = [
            f and self.started[slot] and not done
            for f, slot, done in zip(final, slot_ids, padded_end, strict=True)
        ]
        if any(ending):
            x, lengths = self._pad_ends(x, lengths, slots, ending)
        if max(lengths, default=0) == 0:
            return x.new_zeros(x.shape[0], self.conv.out_channels, 0), lengths
        full = cat_time([self.history[slots.index], x])
        out = self.conv(full)
        starts = upload(lengths, torch.long, x.device)
        self.history[slots.index] = gather_windows(full, starts, self.width)
        return _drop_leading(out, lengths, self.to_drop, slot_ids)

    def _start_slots(
        self, x: torch.Tensor, lengths: Lengths, slot_ids: list[int], final: list[bool]
    ) -> tuple[torch.Tensor, Lengths, list[bool]]:
        """Buffer the slots that cannot make their left padding yet; start those that can.
        A row whose whole stream is here is padded at both ends, as offline (flagged)."""
        pieces, padded_end = [], []
        for index, slot in enumerate(slot_ids):
            piece = x[index, :, : lengths[index]]
            whole = False
            if not self.started[slot]:
                if slot in self.pending:
                    piece = torch.cat([self.pending.pop(slot), piece], dim=-1)
                if final[index] and piece.shape[-1] > 0:
                    padded = EncodecConv1d._pad1d(
                        piece[None], (self.left, self.right), mode=self.pad_mode
                    )[0]
                    self._start(slot, padded[:, : self.left])
                    piece, whole = padded[:, self.left :], True
                elif piece.shape[-1] > self.left:
                    self._start(slot, self._left_padding(piece))
                else:
                    self.pending[slot] = piece.clone()  # a view of a batch not ours to keep
                    piece = piece[:, :0]
            pieces.append(piece)
            padded_end.append(whole)
        lengths = [piece.shape[-1] for piece in pieces]
        return pad_batch(pieces, self.in_channels, x), lengths, padded_end

    def _start(self, slot: int, left_padding: torch.Tensor) -> None:
        """The history before a stream's first sample: ``right`` samples whose outputs are
        dropped, then the left padding."""
        self.history[slot, :, self.right :] = left_padding
        self.started[slot] = True

    def _left_padding(self, head: torch.Tensor) -> torch.Tensor:
        """The left padding of a stream beginning with ``head`` (``[C, n > left]``)."""
        if self.pad_mode == "reflect":
            return head[:, 1 : self.left + 1].flip(-1)
        if self.pad_mode == "replicate":
            return head[:, :1].expand(-1, self.left)
        return head.new_zeros(head.shape[0], self.left)

    def _pad_ends(
        self, x: torch.Tensor, lengths: Lengths, slots: SlotBatch, ending: list[bool]
    ) -> tuple[torch.Tensor, Lengths]:
        """Append the right padding to the rows whose stream ends here (each has had more
        than ``left >= right`` samples, so its last ``right + 1`` are its own)."""
        tails: list[torch.Tensor | None] = []
        for row, (n, ends) in enumerate(zip(lengths, ending, strict=True)):
            if not ends or self.right == 0:
                tails.append(None)
                continue
            recent = torch.cat([self.history[slots.ids[row]], x[row, :, :n]], dim=-1)
            last = recent[:, -(self.right + 1) :]
            if self.pad_mode == "reflect":
                tails.append(last[:, : self.right].flip(-1))
            elif self.pad_mode == "replicate":
                tails.append(last[:, -1:].expand(-1, self.right))
            else:
                tails.append(last.new_zeros(last.shape[0], self.right))
        return _append(x, lengths, tails)


class PointwiseConv(RaggedStage):
    """A 1x1 ``EncodecConv1d`` (no padding): no state."""

    def __init__(self, layer: Any, dtype: torch.dtype) -> None:
        conv: nn.Conv1d = layer.conv
        assert conv.bias is not None
        self.conv = Conv(plain_weight(conv).to(dtype), conv.bias.detach().to(dtype))

    def forward(
        self, x: torch.Tensor, lengths: Lengths, slots: SlotBatch, final: list[bool]
    ) -> tuple[torch.Tensor, Lengths]:
        if x.shape[-1] == 0:  # torch refuses empty convs: shape the empty output by hand
            return x.new_zeros(x.shape[0], self.conv.out_channels, 0), lengths
        return self.conv(x), lengths


class TrimmedConvTranspose(LaggingStage):
    """An ``EncodecConvTranspose1d`` (kernel ``2 * stride``) computed polyphase: output block
    ``t`` (``stride`` samples) is ``W[:, :, :s] · x[t] + W[:, :, s:] · x[t - 1]``, one width-2
    conv whose ``stride * C_out`` channels (phase-major) a reshape of time-major storage
    interleaves into time. The first :func:`transposed_trim` samples are dropped; when a
    stream ends, a zero frame gives the block after its last one, of which the first
    ``stride - right`` samples are kept."""

    def __init__(self, layer: Any, max_streams: int, dtype: torch.dtype) -> None:
        conv: nn.ConvTranspose1d = layer.conv
        weight = plain_weight(conv).to(dtype)  # [C_in, C_out, k]
        self.stride = stride = conv.stride[0]
        if conv.kernel_size[0] != 2 * stride:
            raise CodecError("streaming decode expects transposed kernels of twice the stride")
        self.left, self.right = transposed_trim(layer)
        self.delay = self.left
        in_channels, self.out_channels = weight.shape[0], weight.shape[1]
        taps = torch.stack([weight[:, :, stride:], weight[:, :, :stride]], dim=-1)
        # -> [stride * C_out, C_in, 2], channel (r, o) = r * C_out + o
        phase_major = taps.permute(2, 1, 0, 3).reshape(-1, in_channels, 2)
        assert conv.bias is not None
        self.conv = Conv(phase_major, conv.bias.detach().to(dtype).repeat(stride))
        self.history = zeros(max_streams, in_channels, 1, weight)
        self.to_drop = [self.left] * max_streams

    def reset(self, slot: int) -> None:
        self.history[slot] = 0
        self.to_drop[slot] = self.left

    def forward(
        self, x: torch.Tensor, lengths: Lengths, slots: SlotBatch, final: list[bool]
    ) -> tuple[torch.Tensor, Lengths]:
        kept_after = self.stride - self.right  # samples of the block after the last frame
        ending = [f and kept_after > 0 for f in final]
        if any(ending):
            x = F.pad(zero_padding(x, lengths), (0, 1))
            lengths = [n + e for n, e in zip(lengths, ending, strict=True)]
        batch, _, steps = x.shape
        if max(lengths, default=0) == 0:
            return x.new_zeros(batch, self.out_channels, 0), lengths
        full = cat_time([self.history[slots.index], x])
        phases = self.conv(full)  # [B, stride * C_out, T], time-major
        self.history[slots.index] = gather_windows(full, upload(lengths, torch.long, x.device), 1)
        out = phases.transpose(1, 2).reshape(batch, steps * self.stride, self.out_channels)
        cut = self.stride - kept_after
        out_lengths = [n * self.stride - cut * e for n, e in zip(lengths, ending, strict=True)]
        return _drop_leading(out.transpose(1, 2), out_lengths, self.to_drop, slots.ids)


class DelayLine(LaggingStage):
    """Its input ``delay`` samples later: a residual block's skip path, kept in step with the
    block. When a stream ends, the samples it holds come out."""

    def __init__(self, channels: int, delay: int, max_streams: int, like: torch.Tensor) -> None:
        self.delay = delay
        self.history = zeros(max_streams, channels, delay, like)
        self.to_drop = [delay] * max_streams

    def reset(self, slot: int) -> None:
        self.history[slot] = 0
        self.to_drop[slot] = self.delay

    def forward(
        self, x: torch.Tensor, lengths: Lengths, slots: SlotBatch, final: list[bool]
    ) -> tuple[torch.Tensor, Lengths]:
        if self.delay == 0:
            return x, lengths
        if any(final):
            x = F.pad(zero_padding(x, lengths), (0, self.delay))
            lengths = [n + self.delay * f for n, f in zip(lengths, final, strict=True)]
        if max(lengths, default=0) == 0:
            return x[:, :, :0], lengths
        full = cat_time([self.history[slots.index], x])
        starts = upload(lengths, torch.long, x.device)
        self.history[slots.index] = gather_windows(full, starts, self.delay)
        return _drop_leading(full[:, :, : x.shape[-1]], lengths, self.to_drop, slots.ids)


class Chain(RaggedStage):
    """Stages one after the other."""

    def __init__(self, stages: list[RaggedStage]) -> None:
        self.stages = stages

    def reset(self, slot: int) -> None:
        for stage in self.stages:
            stage.reset(slot)

    def forward(
        self, x: torch.Tensor, lengths: Lengths, slots: SlotBatch, final: list[bool]
    ) -> tuple[torch.Tensor, Lengths]:
        for stage in self.stages:
            x, lengths = stage.forward(x, lengths, slots, final)
        return x, lengths


class DelayedResidual(LaggingStage):
    """``shortcut(x) + block(x)`` where the block delays by its convs' ``right`` paddings:
    the shortcut (identity or a 1x1 conv) runs through a delay line as long. The block's
    first stage must not work in place (the shortcut reads the same input)."""

    def __init__(
        self,
        block: list[RaggedStage],
        shortcut: RaggedStage | None,
        channels: int,
        max_streams: int,
        like: torch.Tensor,
    ) -> None:
        self.block = block
        self.delay = sum(stage.delay for stage in block if isinstance(stage, LaggingStage))
        delay_line = DelayLine(channels, self.delay, max_streams, like)
        self.shortcut = Chain([delay_line] if shortcut is None else [shortcut, delay_line])

    def reset(self, slot: int) -> None:
        for stage in [*self.block, self.shortcut]:
            stage.reset(slot)

    def forward(
        self, x: torch.Tensor, lengths: Lengths, slots: SlotBatch, final: list[bool]
    ) -> tuple[torch.Tensor, Lengths]:
        h, block_lengths = x, lengths
        for stage in self.block:
            h, block_lengths = stage.forward(h, block_lengths, slots, final)
        skip, skip_lengths = self.shortcut.forward(x, lengths, slots, final)
        if block_lengths != skip_lengths:
            raise CodecError("residual branches fell out of step")
        width = max(block_lengths, default=0)
        return add_into_fresh(h[:, :, :width], skip[:, :, :width], x), skip_lengths
