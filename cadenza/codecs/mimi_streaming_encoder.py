"""Streaming Mimi encoding: audio in arbitrary pieces -> the codes of each frame as soon as its
audio is complete, exactly those of the offline encode.

:class:`MimiStreamingEncoder` takes one stream of float32 mono audio at 24 kHz. ``feed(piece)``
returns the codes ``[K, n]`` of every frame whose 1920 samples are now all in (Mimi's encoder
is causal: frame ``t`` reads audio up to sample ``(t + 1) * 1920 - 1`` only); ``finish()``
returns the codes of a trailing partial frame, if any, and readies the encoder for a new
stream. Concatenated, they equal :meth:`~cadenza.codecs.mimi.MimiCodec.encode` of the whole
audio (``ceil(N / 1920)`` frames): a partial last frame is encoded at ``finish`` as the
offline encoder treats it, each strided conv zero-padding its input to a whole stride and the
2x downsampling replicating its last input. Without a partial frame ``finish`` returns no codes.

Per layer the carried state is:

=========================  ==================================================================
layer                      carried state
=========================  ==================================================================
causal conv, stride ``s``  the last ``(k - 1) * dilation`` inputs, of which up to ``s - 1``
                           newest still wait for a whole stride
encoder transformer        the rotated keys/values of the last ``sliding_window`` positions
                           (25 Hz) and the position count
downsample (25 -> 12.5 Hz) as a strided conv; its left padding replicates the first input
ELU, identity skips        nothing
=========================  ==================================================================

The codes are the offline ones exactly as long as no latent lies (to float rounding) halfway
between two codewords; the latents themselves match to float rounding.
"""

from __future__ import annotations

import numpy as np
import torch

from cadenza.codecs.codec import CodecError
from cadenza.codecs.mimi import MimiCodec
from cadenza.codecs.mimi_streaming import SlidingWindowTransformer, run_stages, stage_for
from cadenza.codecs.ragged import RaggedStage
from cadenza.codecs.slot_batch import SlotBatch


class MimiStreamingEncoder:
    """Incremental encoding of one audio stream (see the module docstring)."""

    def __init__(self, codec: MimiCodec) -> None:
        encoder = codec.model.encoder
        if encoder is None:
            raise CodecError("this Mimi model has no encoder")
        self.codec = codec
        self.hop_length = codec.hop_length
        downsample = [] if encoder.downsample is None else [stage_for(encoder.downsample, 1)]
        self._stages: list[RaggedStage] = [
            *(stage_for(layer, 1) for layer in encoder.encoder_seanet.layers),
            SlidingWindowTransformer(encoder.encoder_transformer, 1),
            *downsample,
        ]
        self._slots = SlotBatch.on([0], codec.device)
        self.samples_fed = 0
        self.frames_out = 0

    @torch.inference_mode()
    def feed(self, audio: np.ndarray | torch.Tensor) -> torch.Tensor:
        """More audio (1-D float, 24 kHz) -> codes ``[K, n]`` of the frames it completes."""
        return self._encode(self._samples(audio), final=False)

    @torch.inference_mode()
    def finish(self) -> torch.Tensor:
        """End the stream: codes ``[K, 0 or 1]`` of a trailing partial frame. The encoder is
        then ready for a new stream."""
        empty = torch.zeros(0, device=self.codec.device)
        codes = self._encode(empty, final=True)
        self.reset()
        return codes

    def reset(self) -> None:
        """Forget the stream (start a new one)."""
        for stage in self._stages:
            stage.reset(0)
        self.samples_fed = 0
        self.frames_out = 0

    def _samples(self, audio: np.ndarray | torch.Tensor) -> torch.Tensor:
        if isinstance(audio, np.ndarray):
            audio = torch.from_numpy(np.ascontiguousarray(audio, dtype=np.float32))
        if not isinstance(audio, torch.Tensor) or audio.dim() != 1:
            raise CodecError("streamed audio must be a 1-D (mono) float array")
        if not audio.is_floating_point():
            raise CodecError(f"streamed audio must be float, got {audio.dtype}")
        return audio.to(self.codec.device, torch.float32)

    def _encode(self, samples: torch.Tensor, final: bool) -> torch.Tensor:
        self.samples_fed += samples.numel()
        latents, lengths = run_stages(
            self._stages, samples[None, None], [samples.numel()], self._slots, [final]
        )
        frames = lengths[0]
        self.frames_out += frames
        if frames == 0:
            return torch.zeros(self.codec.num_codebooks, 0, dtype=torch.long)
        quantizer = self.codec.model.quantizer
        codes = quantizer.encode(latents[:, :, :frames], self.codec.num_codebooks)  # [K, 1, n]
        return codes[:, 0]
