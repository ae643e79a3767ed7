"""The ``latents`` token layout: one row per step is one frame of continuous audio latents.

A model that emits continuous latents (Kyutai Pocket TTS: a flow head samples one latent
vector a frame) has no vocabulary to sample from; its own sampler
(:attr:`~cadenza.engine.models.model.AudioTokenModel.samples_rows`) writes each row. Rows stay
integers, like every other layout's, so the KV prefix cache, resumes and the codec's frames
work unchanged: a latent's ``D`` float32 values are carried as their bit patterns
(reinterpreted as signed int32), which round-trip exactly. A row is ``D + 2`` wide::

    column   0          1 .. D                          D + 1
    text     token id   0 ...                           -1
    voice    prompt id  the voice's latent (bits)        -1      (the audio tokenizer's space)
    BOS      BOS id     frames_after_eos, max_frames, 0  -1      (the model's learnt latent)
    frame    latent id  the sampled latent (bits)        countdown

``countdown`` is the model's end-of-speech rule spelled in the rows: ``-1`` until the model
says speech ends, then the frames still to make after this one; the utterance ends at the row
whose countdown is ``0`` (that frame and the tail frames before it are audio). The prompt's
last row (BOS, from which the first frame is sampled) holds the stream's own constants: how
many frames follow the end of speech and the most frames it makes (the model's budget from
its text). A stream also ends after ``seq.target_frames`` frames, the server's length rule.

Sampled latents live in the model's normalised space (what it feeds back); the codec decodes
the audio tokenizer's: :meth:`LatentRowLayout.frame_codes` maps them, ``latent * std + mean``
in float32, as the reference does before decoding.
"""

from __future__ import annotations

import torch

from cadenza.contract.request import FinishReason
from cadenza.engine.layouts.token_layout import RowOutcome
from cadenza.engine.sequence import Sequence

NOT_ENDED = -1
"""The countdown column of a row before the model has said that speech ends."""


def latent_bits(latents: torch.Tensor) -> list[list[int]]:
    """float32 latents ``[n, D]`` -> their bit patterns as Python ints (signed int32)."""
    return latents.detach().to(torch.float32).contiguous().view(torch.int32).tolist()


def latents_of(bits: list[list[int]]) -> torch.Tensor:
    """Bit patterns ``[n][D]`` (signed int32) -> float32 latents ``[n, D]``."""
    return torch.tensor(bits, dtype=torch.int32).reshape(len(bits), -1).view(torch.float32)


class LatentRowLayout:
    """Rows of ``latent_dim`` latents (see the module docstring); ``latent_mean`` and
    ``latent_std`` (``[D]`` float32) map sampled latents to the codec's space."""

    produces_audio = True
    steps_per_frame = 1
    tail_steps = 0

    def __init__(
        self,
        latent_dim: int,
        latent_mean: torch.Tensor,
        latent_std: torch.Tensor,
        *,
        frame_id: int,
        bos_id: int,
    ) -> None:
        if latent_dim < 2:
            raise ValueError("a latent row needs at least two latent values")
        if latent_mean.shape != (latent_dim,) or latent_std.shape != (latent_dim,):
            raise ValueError(f"latent mean and std must be [{latent_dim}]")
        self.latent_dim = latent_dim
        self.codebooks_per_frame = latent_dim
        self.num_codebooks = latent_dim + 2
        self.frame_id = frame_id
        self.bos_id = bos_id
        self.mean = latent_mean.detach().to(torch.float32).cpu()
        self.std = latent_std.detach().to(torch.float32).cpu()

    # -- rows ----------------------------------------------------------------------------------

    def text_row(self, token_id: int) -> list[int]:
        """The row of text token (or placeholder) ``token_id``."""
        return [token_id] + [0] * self.latent_dim + [NOT_ENDED]

    def latent_row(self, token_id: int, bits: list[int], countdown: int = NOT_ENDED) -> list[int]:
        """A row holding a latent's bits after ``token_id`` (a voice frame, a sampled one)."""
        if len(bits) != self.latent_dim:
            raise ValueError(f"a latent has {self.latent_dim} values, got {len(bits)}")
        return [token_id, *bits, countdown]

    def bos_row(self, frames_after_eos: int, max_frames: int) -> list[int]:
        """The prompt's last row, holding the stream's end-of-speech tail and frame budget."""
        if frames_after_eos < 0 or max_frames < 1:
            raise ValueError("frames after the end of speech must be >= 0, max frames >= 1")
        fill = [0] * (self.latent_dim - 2)
        return [self.bos_id, frames_after_eos, max_frames, *fill, NOT_ENDED]

    def stream_constants(self, seq: Sequence) -> tuple[int, int]:
        """``(frames_after_eos, max_frames)`` from ``seq``'s BOS row (its prompt's last)."""
        bos = seq.token_rows[seq.num_prompt_tokens - 1]
        return bos[1], bos[2]

    def countdown(self, seq: Sequence) -> int:
        """The countdown of ``seq``'s last sampled row (:data:`NOT_ENDED` before the first)."""
        return seq.token_rows[-1][-1] if seq.num_generated else NOT_ENDED

    # -- the layout contract ---------------------------------------------------------------------

    def sampling_masks(self) -> torch.Tensor | None:
        return None  # no vocabulary: the model samples its rows

    def constraints(self, seq: Sequence) -> tuple[int, list[int | None] | None]:
        return 0, None

    def on_row(self, seq: Sequence, row: list[int]) -> RowOutcome:
        if row[-1] == 0:
            return seq.num_generated, FinishReason.EOS
        _, max_frames = self.stream_constants(seq)
        limit = min(seq.target_frames, max_frames)
        if seq.num_generated >= limit:
            return limit, FinishReason.LENGTH
        return None, None

    def frames_ready(self, seq: Sequence) -> int:
        return seq.num_generated if seq.end_frame is None else seq.end_frame

    def frame_codes(self, seq: Sequence, start: int, end: int) -> list[list[int]]:
        """Frames ``start .. end-1`` in the codec's space, as bit patterns."""
        rows = seq.output_rows[start:end]
        if not rows:
            return []
        latents = latents_of([row[1 : 1 + self.latent_dim] for row in rows])
        return latent_bits(latents * self.std + self.mean)
