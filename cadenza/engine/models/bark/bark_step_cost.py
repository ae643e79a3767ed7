"""What one :meth:`~cadenza.engine.models.bark.bark_batch.BarkBatch.step` costs, from the work
in it: a step runs up to two causal forward passes (semantic and coarse: one for every stream
decoding, one per stream prefilling a chunk), a fine pass per codebook over the windows that
are due, and EnCodec for the streams whose frames became final. Steps differ by far more
than noise (a coarse window's 887-position prompt against one semantic token), so a live step
is judged against what *its* work cost at calibration, not against an average step.

:class:`StepWork` is what a step did; :class:`BarkStepCost` is a non-negative linear model
of a step's milliseconds in it, fitted to every step the calibration ran.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from cadenza.contract.step_time_model import nonnegative_least_squares


@dataclass
class StepWork:
    """What one batch step did, per causal stage (``semantic_*``, ``coarse_*``): streams that
    decoded one token (in one forward pass), prompt chunks prefilled (one forward pass each)
    and their rows; fine windows run (one pass per predicted codebook, all windows together);
    streams EnCodec decoded frames for, and those frames."""

    semantic_decodes: int = 0
    semantic_chunks: int = 0
    semantic_rows: int = 0
    coarse_decodes: int = 0
    coarse_chunks: int = 0
    coarse_rows: int = 0
    fine_windows: int = 0
    codec_streams: int = 0
    codec_frames: int = 0

    def features(self) -> list[float]:
        """The terms :class:`BarkStepCost` weighs: a fixed cost per forward pass (decode
        batch, prefill chunk, fine passes with the EnCodec call that always follows them) and
        a cost per row, stream or frame in it."""
        return [
            1.0,
            float(self.semantic_decodes > 0),
            float(self.semantic_decodes),
            float(self.semantic_chunks),
            float(self.semantic_rows),
            float(self.coarse_decodes > 0),
            float(self.coarse_decodes),
            float(self.coarse_chunks),
            float(self.coarse_rows),
            float(self.fine_windows > 0),
            float(self.fine_windows),
            float(self.codec_frames),
        ]

    @property
    def streams(self) -> int:
        """Streams that advanced in this step (a stream runs one stage at a time)."""
        return (
            self.semantic_decodes
            + self.semantic_chunks
            + self.coarse_decodes
            + self.coarse_chunks
            + self.fine_windows
        )


@dataclass(frozen=True)
class BarkStepCost:
    """``coefficients``: milliseconds per unit of each of :meth:`StepWork.features`."""

    coefficients: tuple[float, ...]

    def predict_ms(self, work: StepWork) -> float:
        return float(np.dot(self.coefficients, work.features()))

    @classmethod
    def fit(cls, steps: Sequence[tuple[StepWork, float]]) -> BarkStepCost:
        """The non-negative least-squares fit of ``(work, ms)`` steps. Raises ``ValueError``
        without any."""
        if not steps:
            raise ValueError("no steps to fit")
        matrix = np.array([work.features() for work, _ in steps], dtype=float)
        target = np.array([ms for _, ms in steps], dtype=float)
        columns = [matrix[:, index] for index in range(matrix.shape[1])]
        return cls(tuple(nonnegative_least_squares(columns, target)))
