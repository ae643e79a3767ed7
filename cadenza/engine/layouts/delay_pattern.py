"""The delay pattern: ``K`` codebooks emitted in parallel, codebook ``k`` ``delays[k]`` steps
late (MusicGen: ``delays = 0, 1, ..., K-1``; Dia: ``0, 8, 9, ..., 15``).

At decode step ``s`` the model emits one row of ``K`` ids; entry ``k`` is codebook ``k`` of frame
``s - delays[k]``. With ``delays = 0, 1, 2`` and 3 frames::

    step     0    1    2    3    4
    cb 0    f0   f1   f2  pad  pad
    cb 1     .   f0   f1   f2  pad
    cb 2     .    .   f0   f1   f2

What fills the places outside the frames is the model's convention: before the first frame
(``.``) a start id (MusicGen's pad, Dia's BOS); at the end frame an end id where the model marks
it (Dia's EOS, in every codebook as its delay comes), and the pad id after. Frame ``f`` is
complete after step ``f + max(delays)``.

A stream may continue audio its prompt holds (Dia's audio prompt, a voice to clone): the prompt
is the pattern's rows over those frames (:meth:`DelayPattern.rows_over`), and since a late
codebook's last frames are not in those rows, the stream's first steps emit them where the
start id would stand (``lead_in``). With ``delays = 0, 1, 2``, prompt frames ``p0 p1`` and new
frames ``f0 f1``::

             prompt rows | the stream's steps
    step      0    1     |  0    1    2    3
    cb 0     p0   p1     | f0   f1  pad  pad
    cb 1      .   p0     | p1   f0   f1  pad
    cb 2      .    .     | p0   p1   f0   f1

:class:`DelayPattern` is pure arithmetic; :class:`DelayPatternLayout` applies it to engine
sequences.
"""

from __future__ import annotations

from collections.abc import Sequence as RowSequence
from dataclasses import dataclass, field

import torch

from cadenza.contract.request import FinishReason
from cadenza.contract.stream_length import steps_for_frames
from cadenza.engine.layouts.token_layout import RowOutcome
from cadenza.engine.sequence import Sequence


@dataclass(frozen=True)
class DelayPattern:
    """``delays``: each codebook's delay in steps (default ``0 .. num_codebooks - 1``);
    ``start_id``: the id forced before a codebook's first frame (``None``: the pad id);
    ``end_id``: the id forced at the end frame (``None``: the pad id); ``pad_id``: after it."""

    num_codebooks: int
    pad_id: int
    delays: tuple[int, ...] = ()
    start_id: int | None = None
    end_id: int | None = None

    def __post_init__(self) -> None:
        if not self.delays:
            object.__setattr__(self, "delays", tuple(range(self.num_codebooks)))
        if len(self.delays) != self.num_codebooks or min(self.delays) < 0:
            raise ValueError("a delay pattern needs one non-negative delay per codebook")
        object.__setattr__(self, "max_delay", max(self.delays))

    max_delay: int = field(init=False, default=0)  # the longest delay: steps after a frame

    def forced_ids(
        self,
        step: int,
        end_frame: int | None,
        lead_in: RowSequence[RowSequence[int]] = (),
    ) -> list[int | None]:
        """Per codebook, the id step ``step`` must emit, or ``None`` where the model chooses.

        ``end_frame`` is the number of frames of the utterance once known (EOS seen or the length
        limit reached), else ``None``. ``lead_in``: the frames the stream continues (its
        prompt's audio, ``[frames][codebooks]``; see the module docstring): before its first
        frame a codebook emits their last ones, the start id only before those.
        """
        if end_frame is None and step >= self.max_delay:  # the steady state: nothing forced
            return [None] * self.num_codebooks
        forced: list[int | None] = []
        start_id = self.start
        end_id = self.pad_id if self.end_id is None else self.end_id
        for k, delay in enumerate(self.delays):
            frame = step - delay
            if frame < 0:
                earlier = len(lead_in) + frame
                forced.append(lead_in[earlier][k] if earlier >= 0 else start_id)
            elif end_frame is not None and frame == end_frame:
                forced.append(end_id)
            elif end_frame is not None and frame > end_frame:
                forced.append(self.pad_id)
            else:
                forced.append(None)
        return forced

    @property
    def start(self) -> int:
        """The id before a codebook's first frame."""
        return self.pad_id if self.start_id is None else self.start_id

    def rows_over(self, frames: RowSequence[RowSequence[int]]) -> list[list[int]]:
        """The rows of the first ``len(frames)`` steps over ``frames`` (``[frames][codebooks]``):
        step ``s`` holds codebook ``k`` of frame ``s - delays[k]``, the start id before the
        first. A prompt of audio is these rows; the rest of each late codebook comes as the
        ``lead_in`` of :meth:`forced_ids`."""
        return [
            [frames[s - d][k] if s >= d else self.start for k, d in enumerate(self.delays)]
            for s in range(len(frames))
        ]

    def frames_complete(self, num_steps: int) -> int:
        """Frames whose every codebook has been emitted after ``num_steps`` steps."""
        return max(0, num_steps - self.max_delay)

    def steps_needed(self, num_frames: int) -> int:
        """Decode steps that emit every codebook of ``num_frames`` frames."""
        return steps_for_frames(num_frames, steps_per_frame=1, tail_steps=self.max_delay)

    def frame_codes(self, rows: RowSequence[RowSequence[int]], frame: int) -> list[int]:
        """The ``K`` codes of ``frame`` gathered from the emitted ``rows``."""
        return [rows[frame + delay][k] for k, delay in enumerate(self.delays)]


class DelayPatternLayout:
    """The ``parallel+delay`` token layout (see the module docstring) for the engine.

    A stream that continues audio (a stateful model's context frames,
    :attr:`StreamConditioning.context_frames
    <cadenza.engine.models.stream_state.StreamConditioning.context_frames>`, the end of its
    prompt) has their late codebooks forced in its first steps (the ``lead_in``).
    Codebook 0 may emit ``eos_id``: the frame count is then the step at which it did. Otherwise
    the sequence ends after ``seq.target_frames`` frames (where the pattern has an end id,
    codebook 0 is forced to it there). Either way the ``max(delays)`` steps after the last frame
    finish the delayed codebooks, with what comes after the end forced.
    ``codebook_size``: the codes each codebook may sample (ids ``0 .. codebook_size - 1``).
    """

    produces_audio = True
    steps_per_frame = 1

    def __init__(
        self,
        num_codebooks: int,
        codebook_size: int,
        pad_id: int,
        eos_id: int,
        pattern: DelayPattern | None = None,
        vocab_size: int | None = None,
    ) -> None:
        self.pattern = pattern or DelayPattern(num_codebooks, pad_id)
        self.num_codebooks = self.codebooks_per_frame = num_codebooks
        self.tail_steps = self.pattern.max_delay
        self.eos_id = eos_id
        vocab_size = vocab_size or max(pad_id, eos_id) + 1
        masks = torch.zeros(1, num_codebooks, vocab_size, dtype=torch.bool, device="cpu")
        masks[0, :, :codebook_size] = True
        masks[0, 0, eos_id] = True
        self._masks = masks

    def sampling_masks(self) -> torch.Tensor | None:
        return self._masks

    def constraints(self, seq: Sequence) -> tuple[int, list[int | None] | None]:
        if seq.end_frame is None and seq.num_generated >= self.tail_steps:
            return 0, None  # the steady state: nothing forced
        lead_in = () if seq.conditioning is None else seq.conditioning.context_frames
        forced = self.pattern.forced_ids(seq.num_generated, seq.end_frame, lead_in)
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
