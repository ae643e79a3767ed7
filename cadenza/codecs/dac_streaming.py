"""Streaming DAC decoding: many streams, incremental, exactly equal to offline decoding.

DAC's decoder has SNAC's layers (SNAC grew out of DAC) without its noise and depthwise convs:
centred zero-padded convs, transposed convs of kernel ``2 * stride``, residual units, Snake and
tanh. So it streams with the stages SNAC's streaming decoder uses too
(:mod:`~cadenza.codecs.shared_stages`: each centred conv a causal conv plus a fixed delay; their
docstrings say what each carries per slot and holds back), built here from ``transformers``'
DAC layers: this module adds the Snake stage and DAC's residual unit
(``x + conv2(snake2(conv1(snake1(x))))``, its skip path a delay line as long as the dilated
conv's delay).

Concatenating a stream's outputs (the last chunk marked final) equals
:meth:`~cadenza.codecs.dac.DacCodec.decode` of the whole code sequence to float rounding, for
any chunking, and the streams of one batch may be at any point of their own. The price of
exactness is the decoder's lookahead: the last ``lookahead_samples`` of what a stream has sent
(44.1 kHz model: 4,757 samples, 9.3 frames) wait for the codes after them.
"""

from __future__ import annotations

from fractions import Fraction

import torch
from torch import nn
from transformers.models.dac.modeling_dac import (
    DacDecoder,
    DacDecoderBlock,
    DacResidualUnit,
    Snake1d,
)

from cadenza.codecs.codec import CodecError
from cadenza.codecs.dac import DacCodec
from cadenza.codecs.ragged import Lengths, RaggedStage
from cadenza.codecs.shared_stages import CentredConv, Pointwise, Residual, TransposedConv
from cadenza.codecs.slot_batch import SlotBatch
from cadenza.codecs.slot_decoder import SlotDecoder
from cadenza.codecs.snac import snake


class _Snake(RaggedStage):
    """Snake (:func:`~cadenza.codecs.snac.snake`, equal to DAC's ``Snake1d``); it leaves its
    input as it is, so a residual's skip path can read the same input. No state."""

    def __init__(self, layer: Snake1d) -> None:
        self.alpha = layer.alpha.detach()

    def forward(
        self, x: torch.Tensor, lengths: Lengths, slots: SlotBatch, final: list[bool]
    ) -> tuple[torch.Tensor, Lengths]:
        return snake(x, self.alpha), lengths


def _layers(decoder: DacDecoder) -> list[nn.Module]:
    """The decoder's layers in the order its ``forward`` runs them."""
    layers: list[nn.Module] = [decoder.conv1]
    for block in decoder.block:
        assert isinstance(block, DacDecoderBlock)
        layers += [block.snake1, block.conv_t1, block.res_unit1, block.res_unit2, block.res_unit3]
    return [*layers, decoder.snake1, decoder.conv2, decoder.tanh]


def _delay(layer: nn.Module) -> int:
    """How far ``layer``'s streamed output lags its input, in its output's samples: the
    padding of a centred or transposed conv, that of a residual unit's dilated conv."""
    if isinstance(layer, DacResidualUnit):
        layer = layer.conv1
    if isinstance(layer, (nn.Conv1d, nn.ConvTranspose1d)):
        padding = layer.padding
        assert isinstance(padding, tuple)  # DAC's paddings are numbers, never "same"
        return int(padding[0])
    return 0


def _stage_for(layer: nn.Module, max_streams: int) -> RaggedStage:
    if isinstance(layer, Snake1d):
        return _Snake(layer)
    if isinstance(layer, nn.Tanh) or (isinstance(layer, nn.Conv1d) and layer.kernel_size[0] == 1):
        return Pointwise(layer)
    if isinstance(layer, nn.Conv1d):
        kernel, dilation, delay = layer.kernel_size[0], layer.dilation[0], _delay(layer)
        if layer.stride[0] != 1 or 2 * delay != (kernel - 1) * dilation:
            raise CodecError("streaming DAC expects centred stride-1 convolutions")
        return CentredConv(layer, layer.in_channels, delay, max_streams)
    if isinstance(layer, nn.ConvTranspose1d):
        return TransposedConv(layer, max_streams)
    if isinstance(layer, DacResidualUnit):
        block = [layer.snake1, layer.conv1, layer.snake2, layer.conv2]
        skip = CentredConv(None, layer.conv1.in_channels, _delay(layer), max_streams)
        return Residual([_stage_for(sub, max_streams) for sub in block], skip)
    raise CodecError(f"no streaming version of DAC layer {type(layer).__name__}")


class DacStreamingDecoder(SlotDecoder):
    """Per-slot streaming decode of one :class:`~cadenza.codecs.dac.DacCodec`, batched across
    slots (a :class:`~cadenza.codecs.codec.StreamingDecoder`), in float32."""

    def __init__(self, codec: DacCodec, max_streams: int) -> None:
        self.codec = codec
        self._stages: list[RaggedStage] = []
        rate = 1  # output samples per latent step, up to the layer being built
        latency = Fraction(0)  # in latent steps
        for layer in _layers(codec.model.decoder):
            if isinstance(layer, nn.ConvTranspose1d):
                rate *= layer.stride[0]
            latency += Fraction(_delay(layer), rate)
            self._stages.append(_stage_for(layer, max_streams))
        self.lookahead_samples = int(latency * rate)
        """Samples of a stream held back until later codes (or the end) arrive."""
        super().__init__(codec, max_streams)

    def decode_batch(
        self, codes: torch.Tensor, lengths: Lengths, slots: SlotBatch, final: list[bool]
    ) -> tuple[torch.Tensor, Lengths]:
        if codes.shape[-1] == 0:  # only flushing
            x = codes.new_zeros(codes.shape[0], self.codec.latent_channels, 0, dtype=torch.float32)
        else:
            x = self.codec.latent(codes)
        for stage in self._stages:
            x, lengths = stage.forward(x, lengths, slots, final)
        return x[:, 0], lengths

    def reset(self, slot: int) -> None:
        for stage in self._stages:
            stage.reset(slot)
