"""The MusicGen delay pattern: ``K`` codebooks emitted in parallel, codebook ``k`` ``k`` steps late.

At decode step ``s`` the model emits one row of ``K`` ids; entry ``k`` is codebook ``k`` of frame
``s - k``. Entries whose frame is before the first or at/after the last frame are the pad id::

    step     0    1    2    3    4   (K = 3, 3 frames)
    cb 0    f0   f1   f2  pad  pad
    cb 1   pad   f0   f1   f2  pad
    cb 2   pad  pad   f0   f1   f2

Frame ``f`` is complete after step ``f + K - 1``. Pure functions; no torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


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
        return num_frames + self.num_codebooks - 1 if num_frames > 0 else 0

    def frame_codes(self, rows: Sequence[Sequence[int]], frame: int) -> list[int]:
        """The ``K`` codes of ``frame`` gathered diagonally from the emitted ``rows``."""
        return [rows[frame + k][k] for k in range(self.num_codebooks)]
