"""Streaming Mimi decoding: many streams, incremental, exactly equal to offline decoding.

Each stream owns a *slot* (``open()`` hands out a free one). ``decode({slot: codes[K, n]})``
decodes every slot given in one batched pass, chunk lengths may differ, and returns each
slot's new audio. Concatenating a stream's outputs (and the remainder from ``close``, always
empty) equals :meth:`~cadenza.codecs.mimi.MimiCodec.decode` of the whole code sequence, to
float rounding, for any chunking.

Mimi is causal end to end and prefix exact (decoding a prefix of the codes gives the prefix of
the full decode), so nothing is held back: a chunk of ``n`` frames gives ``n * 1920`` samples
at once, and ``final``/``close`` flush nothing. Each layer keeps per-slot state:

=======================  ====================================================================
layer                    carried state
=======================  ====================================================================
upsample (12.5 -> 25 Hz) the previous latent frame: a grouped (channel-wise) transposed conv
                         with ``k = 2 * stride`` whose right overhang the offline decoder
                         trims, computed polyphase (each output block is ``W_head · x[t] +
                         W_tail · x[t - 1]``) so the trimmed tail is never computed.
decoder transformer      per layer, the rotated keys and values of the slot's last
                         ``sliding_window`` positions (``[max_streams, layers, kv_heads,
                         window, head_dim]``), and the slot's position count (25 Hz steps)
                         for RoPE. A query at position ``q`` attends to keys ``q - window <
                         p <= q``: ``window`` keys, itself included, as ``transformers``'
                         sliding-window causal mask has it.
causal Conv1d            the last ``(k - 1) * dilation`` inputs (zero at the start: Mimi pads
                         its causal convs with zeros on the left).
ConvTranspose1d          the previous input frame (polyphase, as for the upsample).
ELU, identity skips      nothing.
=======================  ====================================================================

The stages here are general enough for the encoder too (strided convs that buffer a partial
stride, replicate padding): :mod:`cadenza.codecs.mimi_streaming_encoder` reuses them.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from cadenza.codecs.codec import CodecError
from cadenza.codecs.mimi import MimiCodec
from cadenza.codecs.ragged import Conv, Lengths, RaggedStage, cat_time, gather_windows, zeros
from cadenza.codecs.shared_stages import Elu, Identity, Residual, plain_weight
from cadenza.codecs.slot_batch import SlotBatch
from cadenza.codecs.slot_decoder import SlotDecoder
from cadenza.kernels.host_upload import upload


def _bias(conv: nn.Module) -> torch.Tensor | None:
    bias = conv.bias
    return bias.detach() if isinstance(bias, torch.Tensor) else None


class CausalConv(RaggedStage):
    """A ``MimiConv1d`` (causal), any stride, dilation and groups.

    Offline the conv left-pads ``padding_total = (k - 1) * dilation + 1 - stride`` samples
    (zeros, or copies of the first sample in ``replicate`` mode) and right-pads the input up to
    a whole stride. Output ``j`` reads inputs up to ``(j + 1) * stride - 1``, so it is computed
    as soon as they are in; a slot carries the last ``padding_total + stride - 1`` inputs, of
    which the newest ``leftover < stride`` still wait for a whole stride. A final chunk pads
    its leftover to a whole stride as the offline conv does (zeros, or the last sample).
    """

    def __init__(self, layer: Any, max_streams: int) -> None:
        if not layer.causal:
            raise CodecError("streaming needs Mimi's causal convolutions (use_causal_conv)")
        if layer.pad_mode not in ("constant", "replicate"):
            raise CodecError(f"no streaming version of {layer.pad_mode!r} padding")
        conv = layer.conv
        weight = plain_weight(conv)
        self.stride: int = conv.stride[0]
        dilation: int = conv.dilation[0]
        self.conv = Conv(
            weight, _bias(conv), stride=self.stride, dilation=dilation, groups=conv.groups
        )
        self.span = (conv.kernel_size[0] - 1) * dilation + 1  # effective kernel size
        if self.span < self.stride:
            raise CodecError("streaming needs convolutions no narrower than their stride")
        self.replicate = layer.pad_mode == "replicate"
        self.in_channels: int = conv.in_channels
        self.out_channels: int = conv.out_channels
        self.width = self.span - 1  # carried inputs: padding_total + stride - 1
        self.history = zeros(max_streams, self.in_channels, self.width, weight)
        self.leftover = [0] * max_streams
        self.started = [not self.replicate] * max_streams

    def reset(self, slot: int) -> None:
        self.history[slot] = 0
        self.leftover[slot] = 0
        self.started[slot] = not self.replicate

    def forward(
        self, x: torch.Tensor, lengths: Lengths, slots: SlotBatch, final: list[bool]
    ) -> tuple[torch.Tensor, Lengths]:
        slot_ids = slots.ids
        for index, slot in enumerate(slot_ids):
            if not self.started[slot] and lengths[index] > 0:  # replicate the first sample
                self.history[slot] = x[index, :, :1]
                self.started[slot] = True
        full = cat_time([self.history[slots.index], x])
        if any(final) and self.stride > 1:
            full, lengths = self._pad_final(full, lengths, slot_ids, final)
        leftover = [self.leftover[s] for s in slot_ids]
        pending = [r + n for r, n in zip(leftover, lengths, strict=True)]
        outputs = [p // self.stride for p in pending]
        ends = upload(lengths, torch.long, x.device)  # row b's inputs end at width + n_b
        self.history[slots.index] = gather_windows(full, ends, self.width)
        for slot, p in zip(slot_ids, pending, strict=True):
            self.leftover[slot] = p % self.stride
        most = max(outputs)
        if most == 0:
            return x.new_zeros(x.shape[0], self.out_channels, 0), outputs
        if self.stride == 1:  # every row starts at 0: no realignment
            windows = full
        else:  # row b's first window starts where its leftover does, less the padding
            span = (most - 1) * self.stride + self.span
            starts = [self.stride - 1 - r for r in leftover]
            full = F.pad(full, (0, max(0, max(starts) + span - full.shape[-1])))
            windows = gather_windows(full, upload(starts, torch.long, x.device), span)
        return self.conv(windows)[:, :, :most], outputs

    def _pad_final(
        self, full: torch.Tensor, lengths: Lengths, slot_ids: list[int], final: list[bool]
    ) -> tuple[torch.Tensor, Lengths]:
        """Pad each final row's input up to a whole stride, as the offline conv does."""
        extra = [
            (-(self.leftover[slot] + n)) % self.stride if last else 0
            for slot, n, last in zip(slot_ids, lengths, final, strict=True)
        ]
        if not any(extra):
            return full, lengths
        new_lengths = [n + e for n, e in zip(lengths, extra, strict=True)]
        full = F.pad(full, (0, max(0, self.width + max(new_lengths) - full.shape[-1])))
        for index, (n, e) in enumerate(zip(lengths, extra, strict=True)):
            if e:
                end = self.width + n
                fill = full[index, :, end - 1 : end] if self.replicate else 0.0
                full[index, :, end : end + e] = fill
        return full, new_lengths


class CausalConvTranspose(RaggedStage):
    """A ``MimiConvTranspose1d`` with kernel ``2 * stride`` (any groups), trimmed on the right
    only (``trim_right_ratio = 1``), computed polyphase: output block ``t`` (``stride``
    samples) is ``W_head · x[t] + W_tail · x[t - 1]``, one width-2 conv whose ``C_out *
    stride`` channels are then interleaved into time. The carried state is the previous input
    frame; the offline decoder's trimmed tail is never computed."""

    def __init__(self, layer: Any, max_streams: int) -> None:
        conv = layer.conv
        weight = plain_weight(conv)  # [C_in, C_out / groups, k]
        self.stride = stride = conv.stride[0]
        if conv.kernel_size[0] != 2 * stride:
            raise CodecError("streaming expects transposed kernels of twice the stride")
        if layer.padding_left != 0 or layer.padding_right != stride:
            raise CodecError("streaming needs causal transposed convs (trim_right_ratio = 1)")
        self.groups = groups = conv.groups
        in_channels, per_group = weight.shape[0], weight.shape[1]
        self.out_channels = per_group * groups
        taps = torch.stack([weight[:, :, stride:], weight[:, :, :stride]], dim=-1)
        taps = taps.view(groups, in_channels // groups, per_group, stride, 2)
        # -> [groups * per_group * stride, C_in / groups, 2], channel (g, o, r) = (g*per_group+o, r)
        weights = taps.permute(0, 2, 3, 1, 4).reshape(-1, in_channels // groups, 2)
        bias = _bias(conv)
        self.conv = Conv(
            weights, None if bias is None else bias.repeat_interleave(stride), groups=groups
        )
        self.history = zeros(max_streams, in_channels, 1, weight)

    def reset(self, slot: int) -> None:
        self.history[slot] = 0

    def forward(
        self, x: torch.Tensor, lengths: Lengths, slots: SlotBatch, final: list[bool]
    ) -> tuple[torch.Tensor, Lengths]:
        batch, _, steps = x.shape
        new_lengths = [n * self.stride for n in lengths]
        if steps == 0:
            return x.new_zeros(batch, self.out_channels, 0), new_lengths
        full = cat_time([self.history[slots.index], x])
        phases = self.conv(full)  # [B, C * s, T], time-major; a group's phases are adjacent
        self.history[slots.index] = gather_windows(full, upload(lengths, torch.long, x.device), 1)
        # Storage [B, T, C, s] -> [B, T, s, C] -> time-major [B, C, T * s]: one copy.
        storage = phases.transpose(1, 2).reshape(batch, steps, self.out_channels, self.stride)
        out = storage.transpose(2, 3).reshape(batch, steps * self.stride, self.out_channels)
        return out.transpose(1, 2), new_lengths


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


def _windows4(full: torch.Tensor, starts: torch.Tensor, width: int) -> torch.Tensor:
    """``full[b, :, starts[b] : starts[b] + width, :]`` for every ``b`` (``[B, H, T, D]``)."""
    index = starts[:, None] + torch.arange(width, device=full.device)[None, :]
    index = index[:, None, :, None].expand(-1, full.shape[1], -1, full.shape[3])
    return full.gather(2, index)


class SlidingWindowTransformer(RaggedStage):
    """A ``MimiTransformerModel`` (pre-norm layers, RoPE, layer scales, causal attention over
    the last ``sliding_window`` positions) run incrementally with the module's own weights.

    Per slot it carries every layer's rotated keys and values of the last ``window``
    positions and its position count. A chunk's queries attend to that window plus the
    chunk's own keys, masked per row: key position ``p`` is seen by query position ``q`` iff
    ``0 <= p``, ``q - window < p <= q``. Works on ``[B, C, T]`` like the conv stages.

    The window is the decoder's largest state (8 MB a slot for the public model): it is held
    for the slots opened so far (slots are handed out lowest first), growing by doubling up to
    ``max_streams``, rather than for every slot the decoder could have.
    """

    def __init__(self, transformer: Any, max_streams: int) -> None:
        config = transformer.config
        self.layers = list(transformer.layers)
        self.rotary = transformer.rotary_emb
        self.window: int = config.sliding_window
        if not self.window or self.window < 1:
            raise CodecError("streaming needs Mimi's sliding-window attention")
        attention = self.layers[0].self_attn
        self.heads: int = attention.num_heads
        self.kv_heads: int = attention.num_key_value_heads
        self.head_dim: int = attention.head_dim
        self.scaling: float = attention.scaling
        weight = attention.k_proj.weight
        self.max_streams = max_streams
        self.keys = weight.new_zeros(self._shape(min(max_streams, 4)))
        self.values = torch.zeros_like(self.keys)
        self.positions = torch.zeros(max_streams, dtype=torch.long, device=weight.device)

    def _shape(self, slots: int) -> tuple[int, ...]:
        return (slots, len(self.layers), self.kv_heads, self.window, self.head_dim)

    def reset(self, slot: int) -> None:
        if slot >= self.keys.shape[0]:  # a slot past those held so far is being opened
            held = self.keys.shape[0]
            grown = min(self.max_streams, max(2 * held, slot + 1))
            for name in ("keys", "values"):
                old = getattr(self, name)
                new = old.new_zeros(self._shape(grown))
                new[:held] = old
                setattr(self, name, new)
        self.keys[slot] = 0
        self.values[slot] = 0
        self.positions[slot] = 0

    def forward(
        self, x: torch.Tensor, lengths: Lengths, slots: SlotBatch, final: list[bool]
    ) -> tuple[torch.Tensor, Lengths]:
        batch, _, steps = x.shape
        if steps == 0:
            return x, lengths
        hidden = x.transpose(1, 2)  # [B, T, C]
        first = self.positions[slots.index]
        steps_range = torch.arange(steps, device=x.device)
        query_pos = first[:, None] + steps_range[None, :]  # [B, T]
        past_pos = first[:, None] - self.window + torch.arange(self.window, device=x.device)
        key_pos = torch.cat([past_pos, query_pos], dim=1)[:, None, :]  # [B, 1, W + T]
        seen = (key_pos >= 0) & (key_pos <= query_pos[:, :, None])
        seen &= key_pos > query_pos[:, :, None] - self.window
        mask = seen[:, None]  # [B, 1, T, W + T]
        cos, sin = self.rotary(hidden, query_pos)
        cos, sin = cos[:, None], sin[:, None]  # [B, 1, T, D]
        ends = upload(lengths, torch.long, x.device)
        # Every row a whole chunk (the usual batch): each row's window is the same slice.
        whole = all(length == steps for length in lengths)
        repeats = self.heads // self.kv_heads
        for index, layer in enumerate(self.layers):
            attention = layer.self_attn
            normed = layer.input_layernorm(hidden)
            q = attention.q_proj(normed).view(batch, steps, self.heads, self.head_dim)
            k = attention.k_proj(normed).view(batch, steps, self.kv_heads, self.head_dim)
            v = attention.v_proj(normed).view(batch, steps, self.kv_heads, self.head_dim)
            q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
            q = q * cos + _rotate_half(q) * sin
            k = k * cos + _rotate_half(k) * sin
            keys = torch.cat([self.keys[slots.index, index], k], dim=2)  # [B, H_kv, W + T, D]
            values = torch.cat([self.values[slots.index, index], v], dim=2)
            if whole:
                self.keys[slots.index, index] = keys[:, :, steps:]
                self.values[slots.index, index] = values[:, :, steps:]
            else:
                self.keys[slots.index, index] = _windows4(keys, ends, self.window)
                self.values[slots.index, index] = _windows4(values, ends, self.window)
            if repeats > 1:
                keys = keys.repeat_interleave(repeats, dim=1)
                values = values.repeat_interleave(repeats, dim=1)
            attended = F.scaled_dot_product_attention(
                q, keys, values, attn_mask=mask, scale=self.scaling
            )
            attended = attended.transpose(1, 2).reshape(batch, steps, -1)
            hidden = hidden + layer.self_attn_layer_scale(attention.o_proj(attended))
            mlp = layer.mlp(layer.post_attention_layernorm(hidden))
            hidden = hidden + layer.mlp_layer_scale(mlp)
        self.positions[slots.index] += ends
        return hidden.transpose(1, 2), lengths


def _resnet(layer: Any, max_streams: int, family: str) -> Residual:
    """A SEANet resnet block: ``shortcut(x) + block(x)`` (both branches stride 1)."""
    # The block's first ELU reads the input the shortcut also reads: not in place.
    block = [
        stage_for(sub, max_streams, inplace=index > 0, family=family)
        for index, sub in enumerate(layer.block)
    ]
    return Residual(block, stage_for(layer.shortcut, max_streams, family=family))


def stage_for(
    layer: nn.Module, max_streams: int, inplace: bool = True, family: str = "Mimi"
) -> RaggedStage:
    """The streaming stage of one SEANet layer (or the up/downsampling conv) of a Mimi-shaped
    codec whose ``transformers`` classes are named ``{family}Conv1d``, ``{family}ConvTranspose1d``
    and ``{family}ResnetBlock`` (Mimi's; the Pocket TTS audio tokenizer's)."""
    kind = type(layer).__name__
    if kind == f"{family}Conv1d":
        return CausalConv(layer, max_streams)
    if kind == f"{family}ConvTranspose1d":
        return CausalConvTranspose(layer, max_streams)
    if kind == f"{family}ResnetBlock":
        return _resnet(layer, max_streams, family)
    if isinstance(layer, nn.ELU):
        return Elu(layer, inplace)
    if isinstance(layer, nn.Identity):
        return Identity()
    raise CodecError(f"no streaming version of {family} layer {kind}")


def run_stages(
    stages: list[RaggedStage],
    x: torch.Tensor,
    lengths: Lengths,
    slots: SlotBatch,
    final: list[bool],
) -> tuple[torch.Tensor, Lengths]:
    """``x`` through every stage in turn."""
    for stage in stages:
        x, lengths = stage.forward(x, lengths, slots, final)
    return x, lengths


class MimiStreamingDecoder(SlotDecoder):
    """Per-slot streaming decode of one :class:`~cadenza.codecs.mimi.MimiCodec`, batched
    across slots: each chunk of ``n`` frames gives ``n * hop_length`` samples at once."""

    def __init__(self, codec: MimiCodec, max_streams: int) -> None:
        model = codec.model
        decoder = model.decoder
        self.codec = codec
        self.hop_length = codec.hop_length
        upsample = [] if decoder.upsample is None else [stage_for(decoder.upsample, max_streams)]
        self._stages: list[RaggedStage] = [
            *upsample,
            SlidingWindowTransformer(decoder.decoder_transformer, max_streams),
            *(stage_for(layer, max_streams) for layer in decoder.decoder_seanet.layers),
        ]
        super().__init__(codec, max_streams)

    def decode_batch(
        self, codes: torch.Tensor, lengths: Lengths, slots: SlotBatch, final: list[bool]
    ) -> tuple[torch.Tensor, Lengths]:
        if codes.shape[-1] == 0:
            return torch.zeros(codes.shape[0], 0, device=codes.device), lengths
        latents = self.codec.model.quantizer.decode(codes)  # [B, C, T]
        audio, lengths = run_stages(self._stages, latents, lengths, slots, final)
        return audio[:, 0], lengths

    def reset(self, slot: int) -> None:
        for stage in self._stages:
            stage.reset(slot)
