"""A Bark step's cost from the work in it: the fit recovers the costs that made a set of steps,
none negative, and predicts a step of a new mix."""

from __future__ import annotations

import random

import pytest

from cadenza.engine.models.bark.bark_step_cost import BarkStepCost, StepWork

# ms: 1 a step; a decode pass 2, 0.5 a stream; a prompt chunk 3, 0.01 a row; the fine passes
# and their EnCodec call 20, 4 a window; EnCodec 0.1 a frame.
TRUE = (1.0, 2.0, 0.5, 3.0, 0.01, 2.0, 0.5, 3.0, 0.01, 20.0, 4.0, 0.1)


def _ms(work: StepWork) -> float:
    return sum(c * f for c, f in zip(TRUE, work.features(), strict=True))


def _steps() -> list[tuple[StepWork, float]]:
    """Steps of every mix a batch runs: stages present or not, batches of 1 to 8."""
    rng = random.Random(0)
    works = []
    for _ in range(80):
        streams = [rng.choice((0, 0, 1, 2, 4, 8)) for _ in range(5)]
        chunks = (streams[1], streams[3])
        works.append(
            StepWork(
                semantic_decodes=streams[0],
                semantic_chunks=chunks[0],
                semantic_rows=sum(rng.randint(1, 128) for _ in range(chunks[0])),
                coarse_decodes=streams[2],
                coarse_chunks=chunks[1],
                coarse_rows=sum(rng.randint(1, 128) for _ in range(chunks[1])),
                fine_windows=streams[4],
                codec_streams=streams[4],
                codec_frames=streams[4] * rng.randint(1, 512),
            )
        )
    return [(work, _ms(work)) for work in works]


def test_the_fit_predicts_a_step_of_a_mix_it_never_saw() -> None:
    cost = BarkStepCost.fit(_steps())
    assert all(c >= 0 for c in cost.coefficients)
    unseen = StepWork(
        semantic_decodes=5,
        coarse_decodes=3,
        coarse_chunks=2,
        coarse_rows=300,
        fine_windows=2,
        codec_streams=2,
        codec_frames=700,
    )
    assert cost.predict_ms(unseen) == pytest.approx(_ms(unseen), rel=1e-6)


def test_a_step_counts_the_streams_that_advanced() -> None:
    work = StepWork(semantic_decodes=3, semantic_chunks=1, coarse_decodes=2, fine_windows=1)
    assert work.streams == 7 and StepWork().streams == 0


def test_no_steps_cannot_be_fitted() -> None:
    with pytest.raises(ValueError, match="no steps"):
        BarkStepCost.fit([])
