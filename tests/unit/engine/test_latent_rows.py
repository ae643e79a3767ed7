"""The ``latents`` layout: latents carried exactly as bit patterns, the end-of-speech
countdown and the frame budget spelled in the rows, frames mapped to the codec's space."""

from __future__ import annotations

import pytest
import torch

from cadenza.contract.request import FinishReason
from cadenza.contract.sampling import SamplingParams
from cadenza.engine.layouts.latent_rows import (
    NOT_ENDED,
    LatentRowLayout,
    latent_bits,
    latents_of,
)
from cadenza.engine.sequence import Sequence

D = 4
FRAME, BOS = 4001, 4003


def _layout() -> LatentRowLayout:
    mean = torch.tensor([0.5, -1.0, 0.0, 2.0])
    std = torch.tensor([2.0, 0.5, 1.0, 3.0])
    return LatentRowLayout(D, mean, std, frame_id=FRAME, bos_id=BOS)


def _sequence(layout: LatentRowLayout, frames_after_eos: int = 2, max_frames: int = 10) -> Sequence:
    prompt = [layout.text_row(17), layout.bos_row(frames_after_eos, max_frames)]
    seq = Sequence("r", prompt, SamplingParams(), torch.Generator(), max_new_steps=100)
    seq.target_frames = 50
    return seq


def test_latents_round_trip_exactly_through_their_bit_patterns() -> None:
    latents = torch.tensor([[1e-30, -0.0, float("inf"), 3.14159], [-2.5, 7.0, 1e30, -1e-7]])
    bits = latent_bits(latents)
    assert all(-(2**31) <= b < 2**31 for row in bits for b in row)
    assert torch.equal(latents_of(bits).view(torch.int32), latents.view(torch.int32))


def test_rows_are_the_documented_width_and_the_bos_row_holds_the_stream_constants() -> None:
    layout = _layout()
    seq = _sequence(layout, frames_after_eos=3, max_frames=7)
    assert layout.num_codebooks == D + 2 and layout.codebooks_per_frame == D
    assert all(len(row) == D + 2 for row in seq.token_rows)
    assert layout.stream_constants(seq) == (3, 7)
    assert layout.countdown(seq) == NOT_ENDED
    assert layout.sampling_masks() is None and layout.constraints(seq) == (0, None)


def test_the_stream_ends_at_the_row_whose_countdown_reaches_zero() -> None:
    layout = _layout()
    seq = _sequence(layout)
    zero = [0] * D
    for countdown, expected in ((NOT_ENDED, None), (2, None), (1, None)):
        seq.append(layout.latent_row(FRAME, zero, countdown))
        assert layout.on_row(seq, seq.token_rows[-1]) == (None, expected)
    seq.append(layout.latent_row(FRAME, zero, 0))
    assert layout.on_row(seq, seq.token_rows[-1]) == (4, FinishReason.EOS)


def test_the_stream_ends_at_its_budget_or_the_server_length_whichever_is_first() -> None:
    layout = _layout()
    seq = _sequence(layout, max_frames=3)
    outcomes = []
    for _ in range(3):
        seq.append(layout.latent_row(FRAME, [0] * D))
        outcomes.append(layout.on_row(seq, seq.token_rows[-1]))
    assert outcomes[-1] == (3, FinishReason.LENGTH) and outcomes[0] == (None, None)
    seq = _sequence(layout, max_frames=30)
    seq.target_frames = 2
    seq.append(layout.latent_row(FRAME, [0] * D))
    seq.append(layout.latent_row(FRAME, [0] * D))
    assert layout.on_row(seq, seq.token_rows[-1]) == (2, FinishReason.LENGTH)


def test_frames_are_denormalised_as_the_reference_does_before_decoding() -> None:
    layout = _layout()
    seq = _sequence(layout)
    latents = torch.randn(3, D, generator=torch.Generator().manual_seed(1))
    for bits in latent_bits(latents):
        seq.append(layout.latent_row(FRAME, bits))
    codes = layout.frame_codes(seq, 1, 3)
    expected = latents[1:3] * layout.std + layout.mean
    assert torch.equal(latents_of(codes), expected)
    assert layout.frames_ready(seq) == 3 and layout.frame_codes(seq, 3, 3) == []


def test_garbage_rows_and_shapes_are_refused() -> None:
    layout = _layout()
    with pytest.raises(ValueError, match="latent has 4 values"):
        layout.latent_row(FRAME, [0, 1])
    with pytest.raises(ValueError, match="frames after the end of speech"):
        layout.bos_row(-1, 10)
    with pytest.raises(ValueError, match="mean and std"):
        LatentRowLayout(D, torch.zeros(3), torch.ones(D), frame_id=FRAME, bos_id=BOS)
