"""The ``frames`` token layout: one row per step is one whole codec frame (``K`` codes).

Two-level models (Sesame CSM; the Moshi family) emit a frame per backbone step: the backbone
samples codebook 0, a depth decoder the other ``K - 1`` (see
:class:`~cadenza.engine.models.model.DepthDecoding`). Their prompts mix text positions and audio
positions, so a row is either a frame of codes or a *text row*: the text id first, every other
entry :data:`TEXT_FILL` (an id no codebook has)::

    row      [ 128000, -1, -1, ... ]      text  <|begin_of_text|>
             [    412, 93, 1870, ... ]     audio (a context frame, or a generated one)

The utterance ends at a frame whose first ``K - 1`` codes are all ``eos_code`` (CSM's all-zero
frame; the last codebook is not looked at, as the reference does not), which is not audio, or
after ``seq.target_frames`` frames. Every code is sampled from ``[0, codebook_size)``: ids past
the codec's codebook (CSM's pad id 2050) would make a frame the codec cannot decode.
"""

from __future__ import annotations

import torch

from cadenza.contract.request import FinishReason
from cadenza.engine.layouts.token_layout import RowOutcome
from cadenza.engine.sequence import Sequence

TEXT_FILL = -1


def text_row(token_id: int, num_codebooks: int) -> list[int]:
    """The row that carries text token ``token_id``."""
    return [token_id] + [TEXT_FILL] * (num_codebooks - 1)


def is_text_row(row: list[int]) -> bool:
    return len(row) > 1 and row[1] == TEXT_FILL


class FrameRowLayout:
    produces_audio = True
    steps_per_frame = 1
    tail_steps = 0

    def __init__(self, num_codebooks: int, codebook_size: int, vocab_size: int, eos_code: int):
        if num_codebooks < 2:
            raise ValueError("a frame-per-row layout needs at least two codebooks")
        if not 0 <= eos_code < codebook_size <= vocab_size:
            raise ValueError("eos code and codebook size must lie inside the vocabulary")
        self.num_codebooks = self.codebooks_per_frame = num_codebooks
        self.codebook_size = codebook_size
        self.eos_code = eos_code
        masks = torch.zeros(1, num_codebooks, vocab_size, dtype=torch.bool, device="cpu")
        masks[0, :, :codebook_size] = True
        self._masks = masks

    def sampling_masks(self) -> torch.Tensor | None:
        return self._masks

    def constraints(self, seq: Sequence) -> tuple[int, list[int | None] | None]:
        return 0, None

    def on_row(self, seq: Sequence, row: list[int]) -> RowOutcome:
        if all(code == self.eos_code for code in row[:-1]):
            return seq.num_generated - 1, FinishReason.EOS
        if seq.num_generated >= seq.target_frames:
            return seq.target_frames, FinishReason.LENGTH
        return None, None

    def frames_ready(self, seq: Sequence) -> int:
        return seq.num_generated if seq.end_frame is None else seq.end_frame

    def frame_codes(self, seq: Sequence, start: int, end: int) -> list[list[int]]:
        return [list(row) for row in seq.output_rows[start:end]]
