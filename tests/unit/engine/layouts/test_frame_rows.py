"""The ``frames`` layout of two-level models: text rows, the all-zero end frame, the length
limit, and masks that keep every code inside the codec's codebook."""

from __future__ import annotations

import pytest
import torch

from cadenza.contract.request import FinishReason
from cadenza.contract.sampling import SamplingParams
from cadenza.engine.layouts.frame_rows import TEXT_FILL, FrameRowLayout, is_text_row, text_row
from cadenza.engine.sequence import Sequence

LAYOUT = FrameRowLayout(num_codebooks=4, codebook_size=8, vocab_size=11, eos_code=0)


def _seq(target_frames: int = 10) -> Sequence:
    prompt = [text_row(128000, 4)]
    return Sequence(
        "s", prompt, SamplingParams(), torch.Generator(), 10, target_frames=target_frames
    )


def test_text_rows_are_marked() -> None:
    assert text_row(7, 4) == [7, TEXT_FILL, TEXT_FILL, TEXT_FILL]
    assert is_text_row(text_row(7, 4)) and not is_text_row([7, 0, 0, 0])


def test_a_frame_whose_first_codes_are_all_zero_ends_the_utterance() -> None:
    seq = _seq()
    for row in ([5, 1, 2, 3], [0, 0, 0, 6]):  # the last codebook is not looked at
        seq.append(row)
        seq.end_frame, reason = LAYOUT.on_row(seq, row)
    assert (seq.end_frame, reason) == (1, FinishReason.EOS)
    assert LAYOUT.frames_ready(seq) == 1
    assert LAYOUT.frame_codes(seq, 0, 1) == [[5, 1, 2, 3]]


def test_the_length_limit_ends_it_after_its_frames() -> None:
    seq = _seq(target_frames=2)
    outcomes = []
    for row in ([5, 1, 2, 3], [4, 4, 4, 4]):
        seq.append(row)
        outcomes.append(LAYOUT.on_row(seq, row))
    assert outcomes == [(None, None), (2, FinishReason.LENGTH)]


def test_codes_past_the_codebook_cannot_be_sampled() -> None:
    masks = LAYOUT.sampling_masks()
    assert masks is not None and masks.shape == (1, 4, 11)
    assert masks[0, :, :8].all() and not masks[0, :, 8:].any()
    assert LAYOUT.constraints(_seq()) == (0, None)


def test_inconsistent_sizes_are_refused() -> None:
    with pytest.raises(ValueError):
        FrameRowLayout(num_codebooks=1, codebook_size=8, vocab_size=11, eos_code=0)
    with pytest.raises(ValueError):
        FrameRowLayout(num_codebooks=4, codebook_size=12, vocab_size=11, eos_code=0)
