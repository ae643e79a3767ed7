"""Streaming SNAC decoding: many streams, incremental, exactly equal to offline decoding.

SNAC's decoder is not causal: every conv is centred and zero-padded. Each one becomes a
*causal conv plus a fixed delay*: a centred conv with padding ``p`` is a causal conv whose
output lags its input by ``p`` samples, so each stage drops its first ``p`` outputs (they would
be positions before the stream's start) and, when a stream ends, feeds ``p`` zeros after its
last input (the offline right padding). Per stage and slot the carried state is:

======================  ===================================================================
stage                   carried state
======================  ===================================================================
centred conv            the last ``(k - 1) * dilation`` inputs; outputs still to drop
transposed conv         the previous input frame (polyphase, as for EnCodec); samples to drop.
                        At the end one zero frame yields the last ``padding`` samples.
residual skip path      a delay line as long as its branch's conv delay
noise                   the stream's own noise generator (one draw per output sample)
Snake, 1x1 conv, tanh   nothing
======================  ===================================================================

Concatenating a stream's outputs (the last chunk marked final) equals
:meth:`~cadenza.codecs.snac.SnacCodec.decode` of the whole code sequence to float rounding,
for any chunking, with noise off. The price of exactness is the decoder's lookahead: a chunk's
last ~4,757 samples (24 kHz model: about 2.3 frames) wait for the codes after it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

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
from cadenza.codecs.shared_stages import add_into_fresh
from cadenza.codecs.slot_decoder import SlotDecoder
from cadenza.codecs.snac import DecoderBlock, NoiseBlock, ResidualUnit, SnacCodec, Snake, snake


class _Stage(RaggedStage):
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
    starts = torch.tensor(drops, device=x.device)
    return gather_windows(padded, starts, width), new_lengths


class _Pointwise(_Stage):
    """A 1x1 conv, Snake or tanh: no state."""

    def __init__(self, layer: nn.Module) -> None:
        self.layer = layer
        self.conv = (
            Conv(layer.weight, layer.bias, groups=layer.groups)
            if isinstance(layer, nn.Conv1d)
            else None
        )

    def forward(
        self, x: torch.Tensor, lengths: Lengths, slots: torch.Tensor, final: list[bool]
    ) -> tuple[torch.Tensor, Lengths]:
        if isinstance(self.layer, Snake):
            return snake(x, self.layer.alpha), lengths
        if self.conv is None:
            return self.layer(x), lengths
        if x.shape[-1] == 0:  # torch refuses empty convs: shape the empty output by hand
            return x.new_zeros(x.shape[0], self.conv.out_channels, 0), lengths
        return self.conv(x), lengths


class _CentredConv(_Stage):
    """A centred conv (``conv``), or with ``conv=None`` a pure delay line of ``delay``
    samples, made causal (see the module docstring)."""

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
        self, x: torch.Tensor, lengths: Lengths, slots: torch.Tensor, final: list[bool]
    ) -> tuple[torch.Tensor, Lengths]:
        x, lengths = _extend_final(x, lengths, final, self._delay)
        if max(lengths, default=0) == 0:
            return x[:, :, :0] if self.conv is None else self._empty(x), lengths
        full = cat_time([self.history[slots], x])
        out = full[:, :, : x.shape[-1]] if self.conv is None else self.conv(full)
        self.history[slots] = gather_windows(
            full, torch.tensor(lengths, device=x.device), self.history_len
        )
        return _drop_leading(out, lengths, self.to_drop, slots.tolist())

    def _empty(self, x: torch.Tensor) -> torch.Tensor:
        assert self.conv is not None
        return x.new_zeros(x.shape[0], self.conv.out_channels, 0)


class _TransposedConv(_Stage):
    """A transposed conv with kernel ``2 * stride``, computed polyphase: output block ``t``
    (``stride`` samples) is ``W[:, :, :s] · x[t] + W[:, :, s:] · x[t - 1]``, one width-2 conv
    whose ``stride * C_out`` channels (phase-major) a reshape of time-major storage interleaves
    into time. Offline the output starts ``padding`` samples into that sequence and ends
    ``padding`` samples into the block after the last input's."""

    def __init__(self, conv: nn.ConvTranspose1d, max_streams: int) -> None:
        weight = conv.weight.detach()  # [C_in, C_out, k]
        self.stride = stride = conv.stride[0]
        padding = conv.padding
        assert isinstance(padding, tuple)  # a transposed conv's padding is never a string
        self.padding: int = padding[0]
        output_padding = conv.output_padding[0]
        if conv.kernel_size[0] != 2 * stride or 2 * self.padding - output_padding != stride:
            raise CodecError("streaming SNAC expects transposed convs with kernel 2x stride")
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
        self, x: torch.Tensor, lengths: Lengths, slots: torch.Tensor, final: list[bool]
    ) -> tuple[torch.Tensor, Lengths]:
        x, lengths = _extend_final(x, lengths, final, 1)
        batch, _, steps = x.shape
        if max(lengths, default=0) == 0:
            return x.new_zeros(batch, self.out_channels, 0), lengths
        full = cat_time([self.history[slots], x])
        phases = self.conv(full)  # [B, stride * C_out, T], time-major
        self.history[slots] = gather_windows(full, torch.tensor(lengths, device=x.device), 1)
        out = phases.transpose(1, 2).reshape(batch, steps * self.stride, self.out_channels)
        out = out.transpose(1, 2)
        # A final row's extra zero frame contributes only its first ``padding`` samples.
        tail = self.stride - self.padding
        out_lengths = [n * self.stride - tail * f for n, f in zip(lengths, final, strict=True)]
        return _drop_leading(out, out_lengths, self.to_drop, slots.tolist())


class _Noise(_Stage):
    """``x + noise * linear(x)``, the noise from each stream's own generator."""

    def __init__(self, block: NoiseBlock, max_streams: int, seed: int) -> None:
        self.linear = Conv(block.linear.weight, block.linear.bias)  # a 1x1 conv
        self.seed = seed
        self.generators = [torch.Generator() for _ in range(max_streams)]
        self.streams_started = 0

    def reset(self, slot: int) -> None:
        self.streams_started += 1
        self.generators[slot].manual_seed(self.seed * 1_000_003 + self.streams_started)

    def forward(
        self, x: torch.Tensor, lengths: Lengths, slots: torch.Tensor, final: list[bool]
    ) -> tuple[torch.Tensor, Lengths]:
        if x.shape[-1] == 0:
            return x, lengths
        noise = x.new_zeros(x.shape[0], 1, x.shape[-1])
        for row, (slot, n) in enumerate(zip(slots.tolist(), lengths, strict=True)):
            draw = torch.randn(n, generator=self.generators[slot])
            noise[row, 0, :n] = draw.to(device=x.device, dtype=x.dtype)
        return self.linear(x).mul_(noise).add_(x), lengths


class _Residual(_Stage):
    def __init__(self, unit: ResidualUnit, max_streams: int) -> None:
        self.block = [_stage_for(layer, max_streams) for layer in unit.block]
        channels = unit.block[1].in_channels
        assert isinstance(channels, int)
        delay = int(sum(stage.delay for stage in self.block))
        self.skip = _CentredConv(None, channels, delay, max_streams)

    @property
    def delay(self) -> float:
        return self.skip.delay

    def reset(self, slot: int) -> None:
        for stage in [*self.block, self.skip]:
            stage.reset(slot)

    def forward(
        self, x: torch.Tensor, lengths: Lengths, slots: torch.Tensor, final: list[bool]
    ) -> tuple[torch.Tensor, Lengths]:
        h, block_lengths = x, lengths
        for stage in self.block:
            h, block_lengths = stage.forward(h, block_lengths, slots, final)
        skip, skip_lengths = self.skip.forward(x, lengths, slots, final)
        if block_lengths != skip_lengths:
            raise CodecError("residual branches fell out of step")
        width = max(block_lengths, default=0)
        return add_into_fresh(h[:, :, :width], skip[:, :, :width], x), skip_lengths


def _stage_for(layer: nn.Module, max_streams: int) -> _Stage:
    if isinstance(layer, nn.Conv1d):
        kernel, dilation, padding = layer.kernel_size[0], layer.dilation[0], layer.padding
        assert isinstance(padding, tuple)
        if kernel == 1:
            return _Pointwise(layer)
        if layer.stride[0] != 1 or 2 * padding[0] != (kernel - 1) * dilation:
            raise CodecError("streaming SNAC expects centred stride-1 convolutions")
        return _CentredConv(layer, layer.in_channels, padding[0], max_streams)
    if isinstance(layer, nn.ConvTranspose1d):
        return _TransposedConv(layer, max_streams)
    if isinstance(layer, ResidualUnit):
        return _Residual(layer, max_streams)
    if isinstance(layer, (Snake, nn.Tanh)):
        return _Pointwise(layer)
    raise CodecError(f"no streaming version of SNAC layer {type(layer).__name__}")


class SnacStreamingDecoder(SlotDecoder):
    """Per-slot streaming decode of one :class:`~cadenza.codecs.snac.SnacCodec`, batched
    across slots. Noise (when the codec has it on) comes from a generator per stream, seeded
    from ``noise_seed`` and the stream's order."""

    def __init__(self, codec: SnacCodec, max_streams: int, noise_seed: int = 0) -> None:
        self.codec = codec
        self.hop_length = codec.hop_length
        self._stages: list[_Stage] = []
        rate = 1  # output samples per latent step, up to the stage being built
        latency = 0.0  # in latent steps
        for layer in codec.model.decoder.model:
            sublayers = layer.block if isinstance(layer, DecoderBlock) else [layer]
            for sub in sublayers:
                if isinstance(sub, nn.ConvTranspose1d):
                    rate *= sub.stride[0]
                if isinstance(sub, NoiseBlock):
                    if codec.noise:
                        self._stages.append(_Noise(sub, max_streams, noise_seed))
                    continue
                stage = _stage_for(sub, max_streams)
                latency += stage.delay / rate
                self._stages.append(stage)
        self.lookahead_samples = round(latency * rate)
        self.latent_channels = codec.model.config.latent_channels
        super().__init__(codec, max_streams)

    def decode_batch(
        self, codes: torch.Tensor, lengths: Lengths, slots: torch.Tensor, final: list[bool]
    ) -> tuple[torch.Tensor, Lengths]:
        steps = self.codec.latent_steps_per_frame
        if codes.shape[-1] == 0:  # only flushing
            x = codes.new_zeros(codes.shape[0], self.latent_channels, 0, dtype=torch.float32)
        else:
            x = self.codec.model.latent(self.codec.levels(codes))
        lengths = [n * steps for n in lengths]
        for stage in self._stages:
            x, lengths = stage.forward(x, lengths, slots, final)
        return x[:, 0], lengths

    def reset(self, slot: int) -> None:
        for stage in self._stages:
            stage.reset(slot)
