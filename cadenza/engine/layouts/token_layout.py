"""How a model's tokens relate to audio: the contract every layout implements.

A layout decides, per step, which ids each codebook may be sampled from (a mask chosen from a
small table) and which are forced; after each sampled row it says how many frames the
utterance has (once that is known) and whether the sequence is done; and it says which codec
frames are complete and what their codes are. Layouts never write to a sequence: the
scheduler applies what :meth:`TokenLayout.on_row` returns.

Three layouts exist: ``plain`` (a text LM: no audio, stops at EOS or ``max_new_steps``),
``flat`` (:mod:`~cadenza.engine.layouts.flat`: one token per step, ``K`` consecutive tokens
make a frame) and ``parallel+delay`` (:mod:`~cadenza.engine.layouts.delay_pattern`).
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch

from cadenza.contract.request import FinishReason
from cadenza.contract.stream_length import steps_for_frames
from cadenza.engine.sequence import Sequence

RowOutcome = tuple[int | None, FinishReason | None]
"""After a row: the utterance's frame count (``None`` while unknown) and why the sequence is
finished (``None``: it goes on)."""


class TokenLayout(Protocol):
    num_codebooks: int  # ids per position (per step)
    codebooks_per_frame: int  # codec codebooks in one frame (0: no audio)
    produces_audio: bool
    steps_per_frame: int  # decode steps per codec frame
    tail_steps: int  # steps after the last frame's first (late codebooks of a delay pattern)

    def sampling_masks(self) -> torch.Tensor | None:
        """``[M, K, V]`` bool: the id sets a step may sample from (``None``: every id)."""
        ...

    def constraints(self, seq: Sequence) -> tuple[int, list[int | None] | None]:
        """For ``seq``'s next row: the index of its mask in :meth:`sampling_masks`, and per
        codebook a forced id or ``None`` (the whole list ``None`` when nothing is forced)."""
        ...

    def on_row(self, seq: Sequence, row: list[int]) -> RowOutcome:
        """Called after ``row`` was appended to ``seq`` (nothing else changed yet)."""
        ...

    def frames_ready(self, seq: Sequence) -> int:
        """Codec frames of ``seq`` whose codes are all known."""
        ...

    def frame_codes(self, seq: Sequence, start: int, end: int) -> list[list[int]]:
        """Codes of frames ``start .. end-1``, each a list of ``K`` codebook indices."""
        ...


@runtime_checkable
class ContextRestarts(Protocol):
    """A layout whose streams run through several contexts, each a fresh prompt from position 0
    (Bark: the semantic tokens, then each coarse window, a prompt of its own). After each row
    the scheduler asks :meth:`next_context`; rows it returns replace the sequence's rows and
    KV (its pages go back to the pool, its reservation stays), and the new prompt is
    prefilled like any other. ``max_context``: the most positions any context of a stream
    holds, which is what a stream reserves and admission prices; ``context_rows_per_frame``:
    the prompt rows its later contexts prefill per frame of audio, a stream's steady work
    beside its decode steps, which admission prices too."""

    max_context: int
    context_rows_per_frame: float

    def next_context(self, seq: Sequence) -> list[list[int]] | None:
        """After :meth:`TokenLayout.on_row` (the sequence goes on): the prompt of the
        sequence's next context, or ``None`` to continue this one."""
        ...


def layout_steps_for_frames(layout: TokenLayout, num_frames: int) -> int:
    """Decode steps that produce ``num_frames`` frames with ``layout`` (a stream's step
    budget): the contract's formula, which admission uses too."""
    return steps_for_frames(num_frames, layout.steps_per_frame, layout.tail_steps)


class PlainLayout:
    """A text LM: every id may be sampled; done at an EOS id or after ``max_new_steps``."""

    num_codebooks = 1
    codebooks_per_frame = 0
    produces_audio = False
    steps_per_frame = 1
    tail_steps = 0

    def sampling_masks(self) -> torch.Tensor | None:
        return None

    def constraints(self, seq: Sequence) -> tuple[int, list[int | None] | None]:
        return 0, None

    def on_row(self, seq: Sequence, row: list[int]) -> RowOutcome:
        if row[0] in seq.eos_ids:
            return None, FinishReason.EOS
        return None, None

    def frames_ready(self, seq: Sequence) -> int:
        return 0

    def frame_codes(self, seq: Sequence, start: int, end: int) -> list[list[int]]:
        raise TypeError("a plain LM produces no audio frames")
