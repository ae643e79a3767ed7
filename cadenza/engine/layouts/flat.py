"""The ``flat`` token layout: one token per step, ``K`` consecutive tokens make one codec frame.

Token ``k`` of a frame (``k = step % K``) must come from codebook ``k``'s id range,
``audio_token_offset + k * codebook_size + code``, as Orpheus-style Llama models emit them.
``eos_id`` may end the utterance at a frame boundary; otherwise it ends after
``seq.target_frames`` frames. Sampling is masked to the range of the frame position due, so a
token outside the audio range can never shift the positions of the ones after it.

``frame_order`` maps token positions to the codec's code order: the codec's code ``j`` of a
frame is token ``frame_order[j]`` of it (Orpheus spells a SNAC frame ``L0, L1, L2, L2, L1, L2,
L2``; the codec wants ``L0, L1, L1, L2, L2, L2, L2``: order ``0, 1, 4, 2, 3, 5, 6``).
"""

from __future__ import annotations

import torch

from cadenza.contract.request import FinishReason
from cadenza.engine.layouts.token_layout import RowOutcome
from cadenza.engine.sequence import Sequence


class FlatLayout:
    produces_audio = True
    tail_steps = 0

    def __init__(
        self,
        num_codebooks: int,
        codebook_size: int,
        audio_token_offset: int,
        eos_id: int,
        vocab_size: int,
        frame_order: list[int] | None = None,
    ) -> None:
        last_id = audio_token_offset + num_codebooks * codebook_size
        if last_id > vocab_size or not 0 <= eos_id < vocab_size:
            raise ValueError("audio token range or eos id lies outside the vocabulary")
        self.codebooks_per_frame = num_codebooks
        self.num_codebooks = 1  # one token per step
        self.steps_per_frame = num_codebooks
        self.codebook_size = codebook_size
        self.offset = audio_token_offset
        self.eos_id = eos_id
        self.frame_order = list(range(num_codebooks)) if frame_order is None else frame_order
        if sorted(self.frame_order) != list(range(num_codebooks)):
            raise ValueError(f"frame_order must be a permutation of 0..{num_codebooks - 1}")
        masks = torch.zeros(num_codebooks, 1, vocab_size, dtype=torch.bool)
        for k in range(num_codebooks):
            start = audio_token_offset + k * codebook_size
            masks[k, 0, start : start + codebook_size] = True
        masks[0, 0, eos_id] = True
        self._masks = masks

    def sampling_masks(self) -> torch.Tensor | None:
        return self._masks

    def constraints(self, seq: Sequence) -> tuple[int, list[int | None] | None]:
        return seq.num_generated % self.codebooks_per_frame, None

    def on_row(self, seq: Sequence, row: list[int]) -> RowOutcome:
        at_boundary = (seq.num_generated - 1) % self.codebooks_per_frame == 0
        if row[0] == self.eos_id or (at_boundary and row[0] in seq.sampling.stop_ids):
            return (seq.num_generated - 1) // self.codebooks_per_frame, FinishReason.EOS
        if seq.num_generated >= seq.target_frames * self.codebooks_per_frame:
            return seq.target_frames, FinishReason.LENGTH
        return None, None

    def frames_ready(self, seq: Sequence) -> int:
        complete = seq.num_generated // self.codebooks_per_frame
        return complete if seq.end_frame is None else min(complete, seq.end_frame)

    def frame_codes(self, seq: Sequence, start: int, end: int) -> list[list[int]]:
        rows, k_count, size = seq.output_rows, self.codebooks_per_frame, self.codebook_size
        return [
            [rows[f * k_count + k][0] - self.offset - k * size for k in self.frame_order]
            for f in range(start, end)
        ]

    def tokens_of(self, codes: list[int]) -> list[int]:
        """The token ids that spell one frame of codec codes (the inverse of
        :meth:`frame_codes`)."""
        by_position = [0] * self.codebooks_per_frame
        for j, k in enumerate(self.frame_order):
            by_position[k] = codes[j]
        return [self.offset + k * self.codebook_size + c for k, c in enumerate(by_position)]
