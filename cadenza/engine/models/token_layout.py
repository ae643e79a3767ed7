"""How a model's tokens relate to audio: the contract every layout implements.

A layout decides, per step, which ids each codebook may be sampled from (a mask chosen from a
small table) and which are forced; it updates a sequence after each sampled row and says when
the sequence is done; and it says which codec frames are complete and what their codes are.

Three layouts exist: ``plain`` (a text LM: no audio, stops at EOS or ``max_new_steps``),
``flat`` (``engine/models/flat_layout.py``: one token per step, ``K`` consecutive tokens make a
frame) and ``parallel+delay`` (``engine/models/delay_pattern.py``).
"""

from __future__ import annotations

from typing import Protocol

import torch

from cadenza.engine.request import FinishReason
from cadenza.engine.sequence import Sequence


class TokenLayout(Protocol):
    num_codebooks: int  # ids per position (per step)
    codebooks_per_frame: int  # codec codebooks in one frame (0: no audio)
    produces_audio: bool

    def sampling_masks(self) -> torch.Tensor | None:
        """``[M, K, V]`` bool: the id sets a step may sample from (``None``: every id)."""
        ...

    def constraints(self, seq: Sequence) -> tuple[int, list[int | None] | None]:
        """For ``seq``'s next row: the index of its mask in :meth:`sampling_masks`, and per
        codebook a forced id or ``None`` (the whole list ``None`` when nothing is forced)."""
        ...

    def on_row(self, seq: Sequence, row: list[int]) -> FinishReason | None:
        """Called after ``row`` was appended; returns why ``seq`` is finished, if it is."""
        ...

    def frames_ready(self, seq: Sequence) -> int:
        """Codec frames of ``seq`` whose codes are all known."""
        ...

    def frame_codes(self, seq: Sequence, start: int, end: int) -> list[list[int]]:
        """Codes of frames ``start .. end-1``, each a list of ``K`` codebook indices."""
        ...

    def steps_for_frames(self, num_frames: int) -> int:
        """Decode steps that produce ``num_frames`` frames (the sequence's step budget)."""
        ...


class PlainLayout:
    """A text LM: every id may be sampled; done at an EOS id or after ``max_new_steps``."""

    num_codebooks = 1
    codebooks_per_frame = 0
    produces_audio = False

    def sampling_masks(self) -> torch.Tensor | None:
        return None

    def constraints(self, seq: Sequence) -> tuple[int, list[int | None] | None]:
        return 0, None

    def on_row(self, seq: Sequence, row: list[int]) -> FinishReason | None:
        if row[0] in seq.eos_ids:
            return FinishReason.EOS
        if seq.num_generated >= seq.max_new_steps:
            return FinishReason.LENGTH
        return None

    def frames_ready(self, seq: Sequence) -> int:
        return 0

    def frame_codes(self, seq: Sequence, start: int, end: int) -> list[list[int]]:
        raise TypeError("a plain LM produces no audio frames")

    def steps_for_frames(self, num_frames: int) -> int:
        return num_frames
