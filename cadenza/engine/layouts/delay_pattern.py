"""The MusicGen delay pattern: ``K`` codebooks emitted in parallel, codebook ``k`` ``k`` steps late.

At decode step ``s`` the model emits one row of ``K`` ids; entry ``k`` is codebook ``k`` of frame
``s - k``. Entries whose frame is before the first or at/after the last frame are the pad id::

    step     0    1    2    3    4   (K = 3, 3 frames)
    cb 0    f0   f1   f2  pad  pad
    cb 1   pad   f0   f1   f2  pad
    cb 2   pad  pad   f0   f1   f2

Frame ``f`` is complete after step ``f + K - 1``. :class:`DelayPattern` is pure arithmetic;
:class:`DelayPatternLayout` applies it to engine sequences.
"""

from __future__ import annotations

from collections.abc import Sequence as RowSequence
from dataclasses import dataclass

import torch

from cadenza.contract.request import FinishReason
from cadenza.contract.stream_length import steps_for_frames
from cadenza.engine.layouts.token_layout import RowOutcome
from cadenza.engine.sequence import Sequence


@dataclass(frozen=True)
class DelayPattern:
    num_codebooks: int
    pad_id: int

    def forced_ids(self, step: int, end_frame: int | None) -> list[int | None]:
        """Per codebook, the id step ``step`` must emit (pad) or ``None`` where the model chooses.

        ``end_frame`` is the number of frames of the utterance once known (EOS seen or the length
        limit reached), else ``None``.
        """
        forced: list[int | None] = []
        for codebook in range(self.num_codebooks):
            frame = step - codebook
            out_of_range = frame < 0 or (end_frame is not None and frame >= end_frame)
            forced.append(self.pad_id if out_of_range else None)
        return forced

    def frames_complete(self, num_steps: int) -> int:
        """Frames whose every codebook has been emitted after ``num_steps`` steps."""
        return max(0, num_steps - (self.num_codebooks - 1))

    def steps_needed(self, num_frames: int) -> int:
        """Decode steps that emit every codebook of ``num_frames`` frames."""
        return steps_for_frames(num_frames, steps_per_frame=1, tail_steps=self.num_codebooks - 1)

    def frame_codes(self, rows: RowSequence[RowSequence[int]], frame: int) -> list[int]:
        """The ``K`` codes of ``frame`` gathered diagonally from the emitted ``rows``."""
        return [rows[frame + k][k] for k in range(self.num_codebooks)]


class DelayPatternLayout:
    """The ``parallel+delay`` token layout (see the module docstring) for the engine.

    Codebook 0 may emit ``eos_id``: the frame count is then the step at which it did. Otherwise
    the sequence ends after ``seq.target_frames`` frames. Either way the ``K - 1`` steps after
    the last frame finish the delayed codebooks, with everything past the end forced to pad.
    """

    produces_audio = True
    steps_per_frame = 1

    def __init__(self, num_codebooks: int, codebook_size: int, pad_id: int, eos_id: int) -> None:
        self.num_codebooks = self.codebooks_per_frame = num_codebooks
        self.tail_steps = num_codebooks - 1
        self.pattern = DelayPattern(num_codebooks, pad_id)
        self.eos_id = eos_id
        vocab_size = max(pad_id, eos_id) + 1
        masks = torch.zeros(1, num_codebooks, vocab_size, dtype=torch.bool)
        masks[0, :, :codebook_size] = True
        masks[0, 0, eos_id] = True
        self._masks = masks

    def sampling_masks(self) -> torch.Tensor | None:
        return self._masks

    def constraints(self, seq: Sequence) -> tuple[int, list[int | None] | None]:
        forced = self.pattern.forced_ids(seq.num_generated, seq.end_frame)
        return 0, forced if any(f is not None for f in forced) else None

    def on_row(self, seq: Sequence, row: list[int]) -> RowOutcome:
        step = seq.num_generated - 1
        end_frame = seq.end_frame
        if end_frame is None:
            if row[0] == self.eos_id:
                end_frame = step
            elif step + 1 >= seq.target_frames:
                end_frame = seq.target_frames
        if end_frame is None or seq.num_generated < self.pattern.steps_needed(end_frame):
            return end_frame, None
        return end_frame, FinishReason.EOS if end_frame < seq.target_frames else FinishReason.LENGTH

    def frames_ready(self, seq: Sequence) -> int:
        complete = self.pattern.frames_complete(seq.num_generated)
        return complete if seq.end_frame is None else min(complete, seq.end_frame)

    def frame_codes(self, seq: Sequence, start: int, end: int) -> list[list[int]]:
        rows = seq.output_rows
        return [self.pattern.frame_codes(rows, frame) for frame in range(start, end)]
