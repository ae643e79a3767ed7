"""Streaming Pocket TTS audio tokenizer decoding: many streams, incremental, equal to
:meth:`~cadenza.codecs.pocket_latent.PocketLatentCodec.decode` for any chunking.

The tokenizer's decoder is Mimi's without the quantizer: a 1x1 projection of the latents to
``hidden_size``, the grouped transposed-conv upsample (12.5 -> 25 Hz), the causal
sliding-window transformer, the causal SEANet decoder. Each layer streams with the stage
:mod:`cadenza.codecs.mimi_streaming` has for it (same modules, same per-slot state); the
projection looks at one frame at a time and carries nothing. Everything is causal and prefix
exact, so a chunk of ``n`` frames gives ``n * frame_size`` samples at once and ``final`` /
``close`` flush nothing.

In ``compute_dtype = bfloat16`` (the CPU's bf16 matrix units, ``cpu.codec_dtype``) the stages
run on a bf16 copy of the decoder, weights, activations and state in bf16, and the audio comes
out in float32: it differs from the float32 decode by bf16 rounding (about 1 % of the peak
on the released shape), at 2.5x the speed there (docs/benchmarks.md).

The offline decode fades each waveform in (its first ``len(fade_in)`` samples multiplied by
``linspace(0, 1)``): each slot counts the samples it has emitted and multiplies the same fade
values onto the same samples, whichever chunks they arrive in.
"""

from __future__ import annotations

import copy

import torch

from cadenza.codecs.mimi_streaming import SlidingWindowTransformer, run_stages, stage_for
from cadenza.codecs.pocket_latent import PocketLatentCodec, codes_to_latents
from cadenza.codecs.ragged import Lengths, RaggedStage
from cadenza.codecs.slot_batch import SlotBatch
from cadenza.codecs.slot_decoder import SlotDecoder

FAMILY = "PocketTTSAudioTokenizer"
"""The prefix of the tokenizer's layer classes in ``transformers`` (its SEANet is Mimi's)."""


class PocketLatentStreamingDecoder(SlotDecoder):
    """Per-slot streaming decode of one :class:`~cadenza.codecs.pocket_latent.PocketLatentCodec`,
    batched across slots: each chunk of ``n`` frames gives ``n * frame_size`` samples at once,
    a stream's first samples faded in."""

    def __init__(
        self, codec: PocketLatentCodec, max_streams: int, compute_dtype: torch.dtype = torch.float32
    ) -> None:
        decoder = codec.model.decoder
        self.latent_proj = codec.model.latent_proj
        if compute_dtype != torch.float32:  # a copy in that dtype: the offline decode keeps its
            decoder = copy.deepcopy(decoder).to(compute_dtype)
            self.latent_proj = copy.deepcopy(self.latent_proj).to(compute_dtype)
        self.compute_dtype = compute_dtype
        self.codec = codec
        upsample = (
            []
            if decoder.upsample is None
            else [stage_for(decoder.upsample, max_streams, family=FAMILY)]
        )
        self._stages: list[RaggedStage] = [
            *upsample,
            SlidingWindowTransformer(decoder.decoder_transformer, max_streams),
            *(
                stage_for(layer, max_streams, family=FAMILY)
                for layer in decoder.decoder_seanet.layers
            ),
        ]
        self.samples_emitted = [0] * max_streams
        super().__init__(codec, max_streams)

    def decode_batch(
        self, codes: torch.Tensor, lengths: Lengths, slots: SlotBatch, final: list[bool]
    ) -> tuple[torch.Tensor, Lengths]:
        if codes.shape[-1] == 0:
            return torch.zeros(codes.shape[0], 0, device=codes.device), lengths
        latents = codes_to_latents(codes).to(self.compute_dtype)
        hidden = self.latent_proj(latents)  # [B, hidden, T]
        audio, lengths = run_stages(self._stages, hidden, lengths, slots, final)
        audio = audio[:, 0].float()
        self._fade_in(audio, lengths, slots.ids)
        return audio, lengths

    def _fade_in(self, audio: torch.Tensor, lengths: Lengths, slot_ids: list[int]) -> None:
        """Multiply each row's samples that fall in its stream's fade-in by the fade."""
        fade = self.codec.fade_in
        for row, (slot, length) in enumerate(zip(slot_ids, lengths, strict=True)):
            start = self.samples_emitted[slot]
            if start < fade.numel():
                count = min(fade.numel() - start, length)
                audio[row, :count] *= fade[start : start + count]
            self.samples_emitted[slot] = start + length

    def reset(self, slot: int) -> None:
        for stage in self._stages:
            stage.reset(slot)
        self.samples_emitted[slot] = 0
