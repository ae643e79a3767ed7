"""Streaming EnCodec decoding: many streams, incremental, exactly equal to offline decoding.

Each stream owns a *slot* (``open()`` hands out a free one). ``decode({slot: codes[K, n]})``
decodes every slot given in one batched pass, chunk lengths may differ, and returns each
slot's new audio. Concatenating a stream's outputs (the last chunk marked final, or the
remainder from ``close``) equals ``EncodecCodec.decode`` of the whole code sequence, to float
rounding, for any chunking.

A causal EnCodec decoder (the 24 kHz model) is a chain of causal layers; each keeps per-slot
state:

=====================  =====================================================================
layer                  carried state
=====================  =====================================================================
Conv1d (stride 1)      the last ``(k - 1) * dilation`` input samples. Offline, the left padding
                       *reflects* the first samples, so the first output needs ``pad + 1``
                       inputs: a slot buffers until it has them (the first conv waits for 7
                       frames), then the reflection becomes its history.
ConvTranspose1d        the previous input frame: with ``k = 2 * stride`` each output block
                       depends on two input frames (computed polyphase, as a stride-1 conv).
                       The tail the offline decoder trims at the end is never computed.
LSTM                   ``(h, c)`` of every layer (float32 on the CPU's native kernel, which
                       runs each row of a ragged chunk for its own length).
ELU, 1x1 convs         nothing.
=====================  =====================================================================

A stream shorter than the first conv's padding is finished at ``close`` exactly as the offline
decoder treats a short input (zero-extended before reflecting).

A non-causal decoder (MusicGen's 32 kHz model) has centred convs and transposed convs trimmed
at both ends: its conv stages (:mod:`~cadenza.codecs.encodec_noncausal`) hold back what each
layer looks ahead, ``lookahead_samples`` in all, and pad the end of a stream as the offline
layers do when it ends; its LSTM and ELUs are the causal decoder's.

In ``compute_dtype = bfloat16`` (the CPU's bf16 matrix units) every layer keeps its weights and
state in bf16 and the output is converted to float32: the audio then differs from the float32
decode by bf16 rounding (docs/benchmarks.md measures it), and streaming equals offline decoding
in the same dtype to that rounding.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from cadenza.codecs.codec import CodecError
from cadenza.codecs.encodec import EncodecCodec
from cadenza.codecs.encodec_noncausal import (
    DelayedResidual,
    PaddedConv,
    PointwiseConv,
    TrimmedConvTranspose,
    lookahead_samples,
    transposed_trim,
)
from cadenza.codecs.ragged import (
    Conv,
    Lengths,
    RaggedStage,
    cat_time,
    gather_windows,
    pad_batch,
    zeros,
)
from cadenza.codecs.shared_stages import Elu, Residual, plain_weight
from cadenza.codecs.slot_batch import SlotBatch
from cadenza.codecs.slot_decoder import SlotDecoder
from cadenza.kernels.cpu_lstm import NativeLstm
from cadenza.kernels.host_upload import upload


class _CausalConv(RaggedStage):
    def __init__(self, layer: Any, max_streams: int, dtype: torch.dtype) -> None:
        conv = layer.conv
        weight = plain_weight(conv).to(dtype)
        dilation = conv.dilation[0]
        self.conv = Conv(weight, conv.bias.to(dtype), dilation=dilation)
        self.pad = (conv.kernel_size[0] - 1) * dilation
        if conv.stride[0] != 1:
            raise CodecError("streaming decode supports stride-1 convolutions only")
        self.in_channels = conv.in_channels
        self.history = zeros(max_streams, self.in_channels, self.pad, weight)
        self.started = [self.pad == 0] * max_streams
        self.pending: dict[int, torch.Tensor] = {}

    def reset(self, slot: int) -> None:
        self.started[slot] = self.pad == 0
        self.pending.pop(slot, None)
        self.history[slot] = 0

    def forward(
        self, x: torch.Tensor, lengths: Lengths, slots: SlotBatch, final: list[bool]
    ) -> tuple[torch.Tensor, Lengths]:
        slot_ids = slots.ids
        if not all(self.started[s] for s in slot_ids):
            x, lengths = self._start_slots(x, lengths, slot_ids, final)
        if x.shape[-1] == 0:
            return x.new_zeros(x.shape[0], self.conv.out_channels, 0), lengths
        if self.pad == 0:
            return self.conv(x), lengths
        full = cat_time([self.history[slots.index], x])
        out = self.conv(full)
        starts = upload(lengths, torch.long, x.device)
        self.history[slots.index] = gather_windows(full, starts, self.pad)
        return out, lengths

    def _start_slots(
        self, x: torch.Tensor, lengths: Lengths, slot_ids: list[int], final: list[bool]
    ) -> tuple[torch.Tensor, Lengths]:
        """Buffer slots that cannot reflect-pad yet; start those that can."""
        pieces, new_lengths = [], []
        for index, slot in enumerate(slot_ids):
            piece = x[index, :, : lengths[index]]
            if not self.started[slot]:
                if slot in self.pending:
                    piece = torch.cat([self.pending.pop(slot), piece], dim=-1)
                if piece.shape[-1] > self.pad or (final[index] and piece.shape[-1] > 0):
                    # Offline reflection, zero-extending a stream shorter than the padding.
                    extended = F.pad(piece, (0, max(0, self.pad + 1 - piece.shape[-1])))
                    self.history[slot] = extended[:, 1 : self.pad + 1].flip(-1)
                    self.started[slot] = True
                else:
                    self.pending[slot] = piece
                    piece = piece[:, :0]
            pieces.append(piece)
            new_lengths.append(piece.shape[-1])
        return pad_batch(pieces, self.in_channels, x), new_lengths


class _CausalConvTranspose(RaggedStage):
    """A causal transposed conv with kernel ``2 * stride``, computed polyphase: output block
    ``t`` (``stride`` samples) is ``W_head · x[t] + W_tail · x[t - 1]``, one stride-1 conv of
    width 2 whose ``stride * C_out`` channels (phase-major) are then interleaved into time: in
    time-major storage that is a reshape, no copy. The carried state is the previous input
    frame; the offline decoder's trimmed tail is never computed."""

    def __init__(self, layer: Any, max_streams: int, dtype: torch.dtype) -> None:
        conv = layer.conv
        weight = plain_weight(conv).to(dtype)  # [C_in, C_out, k]
        self.stride = stride = conv.stride[0]
        if conv.kernel_size[0] != 2 * stride:
            raise CodecError("streaming decode expects transposed kernels of twice the stride")
        in_channels, self.out_channels = weight.shape[0], weight.shape[1]
        taps = torch.stack([weight[:, :, stride:], weight[:, :, :stride]], dim=-1)
        # -> [stride * C_out, C_in, 2], channel (r, o) = r * C_out + o
        phase_major = taps.permute(2, 1, 0, 3).reshape(-1, in_channels, 2)
        self.conv = Conv(phase_major, conv.bias.detach().to(dtype).repeat(stride))
        self.history = zeros(max_streams, in_channels, 1, weight)

    def reset(self, slot: int) -> None:
        self.history[slot] = 0

    def forward(
        self, x: torch.Tensor, lengths: Lengths, slots: SlotBatch, final: list[bool]
    ) -> tuple[torch.Tensor, Lengths]:
        batch, _, steps = x.shape
        if steps == 0:
            return x.new_zeros(batch, self.out_channels, 0), lengths
        full = cat_time([self.history[slots.index], x])
        phases = self.conv(full)  # [B, stride * C_out, T], time-major
        starts = upload(lengths, torch.long, x.device)
        self.history[slots.index] = gather_windows(full, starts, 1)
        out = phases.transpose(1, 2).reshape(batch, steps * self.stride, self.out_channels)
        return out.transpose(1, 2), [n * self.stride for n in lengths]


class _StreamingLSTM(RaggedStage):
    """EnCodec's LSTM with its skip connection: ``y = lstm(x) + x``. On the CPU the layers
    run through the native kernel (:mod:`cadenza.kernels.cpu_lstm`: weights packed once, a
    ragged batch in one call per layer, float32 state); elsewhere, or without a C++ compiler,
    through ``torch.nn.LSTM`` (a ragged batch as a packed sequence)."""

    def __init__(self, layer: Any, max_streams: int, dtype: torch.dtype) -> None:
        lstm: nn.LSTM = layer.lstm
        device = next(lstm.parameters()).device
        self.native = NativeLstm.build(lstm, dtype) if device.type == "cpu" else None
        # torch's path runs a copy in the compute dtype (the native kernel packs its own)
        needs_copy = dtype != torch.float32 and self.native is None
        self.lstm = copy.deepcopy(lstm).to(dtype) if needs_copy else lstm
        state_dtype = torch.float32 if self.native is not None else dtype
        size = (lstm.num_layers, max_streams, lstm.hidden_size)
        self.h = torch.zeros(size, dtype=state_dtype, device=device)
        self.c = torch.zeros(size, dtype=state_dtype, device=device)

    def reset(self, slot: int) -> None:
        self.h[:, slot] = 0
        self.c[:, slot] = 0

    def forward(
        self, x: torch.Tensor, lengths: Lengths, slots: SlotBatch, final: list[bool]
    ) -> tuple[torch.Tensor, Lengths]:
        live = [i for i, n in enumerate(lengths) if n > 0]
        if not live:
            return x, lengths
        if self.native is not None:
            return self._native_forward(x, lengths, slots), lengths
        seq = x.permute(2, 0, 1)  # [T, B, C]
        if len(live) == len(lengths) and min(lengths) == seq.shape[0]:
            out, (h, c) = self.lstm(seq, (self.h[:, slots.index], self.c[:, slots.index]))
            self.h[:, slots.index], self.c[:, slots.index] = h, c
            return (out + seq).permute(1, 2, 0), lengths
        live_slots = slots.rows(live).index
        packed = nn.utils.rnn.pack_padded_sequence(
            seq[:, live], torch.tensor([lengths[i] for i in live]), enforce_sorted=False
        )
        out, (h, c) = self.lstm(packed, (self.h[:, live_slots], self.c[:, live_slots]))
        self.h[:, live_slots], self.c[:, live_slots] = h, c
        unpacked, _ = nn.utils.rnn.pad_packed_sequence(out, total_length=seq.shape[0])
        result = seq.clone()
        result[:, live] = unpacked + seq[:, live]
        return result.permute(1, 2, 0), lengths

    def _native_forward(self, x: torch.Tensor, lengths: Lengths, slots: SlotBatch) -> torch.Tensor:
        """The kernel's pass; the output is time-major (``[B, T, C]`` storage)."""
        assert self.native is not None
        storage = x.transpose(1, 2).float().contiguous()  # [B, T, C]
        h, c = self.h[:, slots.index].contiguous(), self.c[:, slots.index].contiguous()
        out = self.native(storage, lengths, h, c)
        self.h[:, slots.index], self.c[:, slots.index] = h, c
        return out.add_(storage).to(x.dtype).transpose(1, 2)


def _resnet(layer: Any, max_streams: int, dtype: torch.dtype) -> RaggedStage:
    # The block's first ELU reads the input the shortcut also reads: not in place.
    block = [
        _stage_for(sub, max_streams, dtype, inplace=index > 0)
        for index, sub in enumerate(layer.block)
    ]
    if layer.block[1].causal:
        return Residual(block, _stage_for(layer.shortcut, max_streams, dtype))
    shortcut = None if isinstance(layer.shortcut, nn.Identity) else layer.shortcut
    return DelayedResidual(
        block,
        None if shortcut is None else _stage_for(shortcut, max_streams, dtype),
        layer.block[1].conv.in_channels,
        max_streams,
        torch.zeros(0, dtype=dtype, device=layer.block[1].conv.weight.device),
    )


def _conv(layer: Any, max_streams: int, dtype: torch.dtype) -> RaggedStage:
    if layer.causal:
        return _CausalConv(layer, max_streams, dtype)
    if layer.conv.kernel_size[0] == 1:
        return PointwiseConv(layer, dtype)
    return PaddedConv(layer, max_streams, dtype)


def _conv_transpose(layer: Any, max_streams: int, dtype: torch.dtype) -> RaggedStage:
    if layer.causal and transposed_trim(layer)[0] == 0:
        return _CausalConvTranspose(layer, max_streams, dtype)
    return TrimmedConvTranspose(layer, max_streams, dtype)


def _stage_for(
    layer: nn.Module, max_streams: int, dtype: torch.dtype, inplace: bool = True
) -> RaggedStage:
    kind = type(layer).__name__
    if kind == "EncodecConv1d":
        return _conv(layer, max_streams, dtype)
    if kind == "EncodecConvTranspose1d":
        return _conv_transpose(layer, max_streams, dtype)
    if kind == "EncodecLSTM":
        return _StreamingLSTM(layer, max_streams, dtype)
    if kind == "EncodecResnetBlock":
        return _resnet(layer, max_streams, dtype)
    if isinstance(layer, nn.ELU):
        return Elu(layer, inplace)
    raise CodecError(f"no streaming version of decoder layer {kind}")


class EncodecStreamingDecoder(SlotDecoder):
    """Per-slot streaming decode of one :class:`EncodecCodec`, batched across slots.

    Causal model (24 kHz): a stream's first samples appear when its first conv has enough
    context (7 frames), all at once; after that each chunk of ``n`` frames gives
    ``n * hop_length`` samples. Non-causal model (MusicGen's 32 kHz): once a stream has more
    than the first conv's left padding (4 frames), ``n`` frames sent give
    ``n * hop_length - lookahead_samples`` samples in all, the rest when it ends."""

    def __init__(
        self, codec: EncodecCodec, max_streams: int, compute_dtype: torch.dtype = torch.float32
    ) -> None:
        config = codec.model.config
        if config.norm_type != "weight_norm":
            raise CodecError("streaming decode supports weight-normalised EnCodec only")
        if config.chunk_length is not None:
            raise CodecError("streaming decode supports EnCodec without chunking only")
        self.codec = codec
        self.hop_length = codec.hop_length
        self.compute_dtype = compute_dtype
        self._stages = [
            _stage_for(layer, max_streams, compute_dtype) for layer in codec.model.decoder.layers
        ]
        self.lookahead_samples = lookahead_samples(codec.model)
        """Samples of a stream held back until later codes (or the end) arrive."""
        super().__init__(codec, max_streams)

    def decode_batch(
        self, codes: torch.Tensor, lengths: Lengths, slots: SlotBatch, final: list[bool]
    ) -> tuple[torch.Tensor, Lengths]:
        x = self.codec.model.quantizer.decode(codes.transpose(0, 1)).to(self.compute_dtype)
        for stage in self._stages:
            x, lengths = stage.forward(x, lengths, slots, final)
        return x[:, 0], lengths

    def reset(self, slot: int) -> None:
        for stage in self._stages:
            stage.reset(slot)
