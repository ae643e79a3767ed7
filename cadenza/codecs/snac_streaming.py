"""Streaming SNAC decoding: many streams, incremental, exactly equal to offline decoding.

SNAC's decoder is not causal: every conv is centred and zero-padded. Each one becomes a
*causal conv plus a fixed delay*: a centred conv with padding ``p`` is a causal conv whose
output lags its input by ``p`` samples, so each stage drops its first ``p`` outputs (they would
be positions before the stream's start) and, when a stream ends, feeds ``p`` zeros after its
last input (the offline right padding). The conv and pointwise stages are
:mod:`~cadenza.codecs.shared_stages`' (DAC streams with them too); noise and the residual unit
are SNAC's own. Per stage and slot the carried state is:

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
from torch import nn

from cadenza.codecs.codec import CodecError
from cadenza.codecs.ragged import Conv, Lengths
from cadenza.codecs.shared_stages import (
    CentredConv,
    DelayedStage,
    Pointwise,
    TransposedConv,
    add_into_fresh,
)
from cadenza.codecs.slot_batch import SlotBatch
from cadenza.codecs.slot_decoder import SlotDecoder
from cadenza.codecs.snac import DecoderBlock, NoiseBlock, ResidualUnit, SnacCodec, Snake


class _Noise(DelayedStage):
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
        self, x: torch.Tensor, lengths: Lengths, slots: SlotBatch, final: list[bool]
    ) -> tuple[torch.Tensor, Lengths]:
        if x.shape[-1] == 0:
            return x, lengths
        noise = x.new_zeros(x.shape[0], 1, x.shape[-1])
        for row, (slot, n) in enumerate(zip(slots.ids, lengths, strict=True)):
            draw = torch.randn(n, generator=self.generators[slot])
            noise[row, 0, :n] = draw.to(device=x.device, dtype=x.dtype)
        return self.linear(x).mul_(noise).add_(x), lengths


class _Residual(DelayedStage):
    def __init__(self, unit: ResidualUnit, max_streams: int) -> None:
        self.block = [_stage_for(layer, max_streams) for layer in unit.block]
        channels = unit.block[1].in_channels
        assert isinstance(channels, int)
        delay = int(sum(stage.delay for stage in self.block))
        self.skip = CentredConv(None, channels, delay, max_streams)

    @property
    def delay(self) -> float:
        return self.skip.delay

    def reset(self, slot: int) -> None:
        for stage in [*self.block, self.skip]:
            stage.reset(slot)

    def forward(
        self, x: torch.Tensor, lengths: Lengths, slots: SlotBatch, final: list[bool]
    ) -> tuple[torch.Tensor, Lengths]:
        h, block_lengths = x, lengths
        for stage in self.block:
            h, block_lengths = stage.forward(h, block_lengths, slots, final)
        skip, skip_lengths = self.skip.forward(x, lengths, slots, final)
        if block_lengths != skip_lengths:
            raise CodecError("residual branches fell out of step")
        width = max(block_lengths, default=0)
        return add_into_fresh(h[:, :, :width], skip[:, :, :width], x), skip_lengths


def _stage_for(layer: nn.Module, max_streams: int) -> DelayedStage:
    if isinstance(layer, nn.Conv1d):
        kernel, dilation, padding = layer.kernel_size[0], layer.dilation[0], layer.padding
        assert isinstance(padding, tuple)
        if kernel == 1:
            return Pointwise(layer)
        if layer.stride[0] != 1 or 2 * padding[0] != (kernel - 1) * dilation:
            raise CodecError("streaming SNAC expects centred stride-1 convolutions")
        return CentredConv(layer, layer.in_channels, padding[0], max_streams)
    if isinstance(layer, nn.ConvTranspose1d):
        return TransposedConv(layer, max_streams)
    if isinstance(layer, ResidualUnit):
        return _Residual(layer, max_streams)
    if isinstance(layer, (Snake, nn.Tanh)):
        return Pointwise(layer)
    raise CodecError(f"no streaming version of SNAC layer {type(layer).__name__}")


class SnacStreamingDecoder(SlotDecoder):
    """Per-slot streaming decode of one :class:`~cadenza.codecs.snac.SnacCodec`, batched
    across slots. Noise (when the codec has it on) comes from a generator per stream, seeded
    from ``noise_seed`` and the stream's order."""

    def __init__(self, codec: SnacCodec, max_streams: int, noise_seed: int = 0) -> None:
        self.codec = codec
        self.hop_length = codec.hop_length
        self._stages: list[DelayedStage] = []
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
        self, codes: torch.Tensor, lengths: Lengths, slots: SlotBatch, final: list[bool]
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
