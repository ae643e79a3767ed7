"""How long one engine step takes, as a function of its work: the real-time half of admission.

A step's time depends on ``tokens``, the rows it computes (one per decoding stream, more for
prefill chunks; sampling and the amortised codec decode ride along) and ``context_tokens``, the
KV positions its attention reads (:func:`attended_context`: decodes padded to the longest, or
each its own where the engine reads every sequence's pages in place).
Measured decode points are interpolated over ``tokens``, and a linear term per 1,000 context
positions covers attention. The points come from a start-up sweep
(:mod:`cadenza.engine.realtime.calibration`); the engine's online correction then scales
predictions by what live steps actually take, so a slower machine (or a busier one) lowers the
capacity estimate. The edge's admission and the engine's deadline policy use this same model.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

_UNBOUNDED_ROWS = 2**31 - 1  # prompt rows that cost nothing: no limit


@dataclass(frozen=True)
class StepSample:
    """One measured step: rows computed, KV positions attended, mean wall time."""

    tokens: int
    context_tokens: int
    ms: float


def step_budget_s(frame_period_s: float, steps_per_frame: int, headroom: float) -> float:
    """The longest step that keeps every stream real-time: one frame period per
    ``steps_per_frame`` steps, less the ``headroom`` share kept free for jitter."""
    return frame_period_s / steps_per_frame * (1.0 - headroom)


def attended_context(
    decode_lengths: list[int], prefill_lengths: list[int], decodes_padded: bool = True
) -> int:
    """The KV positions a step's attention touches: each prefill chunk its own; decodes every
    sequence's keys padded to the longest one (``B x max``), or with ``decodes_padded`` off
    (an engine whose decodes read each sequence's pages in place,
    :mod:`cadenza.kernels.fused_cpu_decode`) their sum."""
    if decodes_padded:
        decode = len(decode_lengths) * max(decode_lengths, default=0)
    else:
        decode = sum(decode_lengths)
    return decode + sum(prefill_lengths)


@dataclass(frozen=True)
class StepTimeModel:
    """Predicted step time. ``decode_points`` (measured pure-decode steps at short context,
    ``(streams, context_tokens, ms)``) are interpolated, which follows the real curve where a
    straight line would not (caches, thread hand-offs); between and beyond them the linear
    terms fill in: ``per_kilocontext_ms`` for context away from the measured one and
    ``per_token_ms`` past the last point and for prefill rows. A prompt row costs
    ``prefill_ms_per_token`` for the layers plus ``prefill_ms_per_row_position`` for each KV
    position its attention reads (itself and every row before it), measured on prompts of
    several lengths: a long prompt's rows cost more than a short one's."""

    fixed_ms: float
    per_token_ms: float
    per_kilocontext_ms: float  # per 1,000 attended KV positions
    decode_points: tuple[tuple[int, int, float], ...] = ()
    prefill_ms_per_token: float = 0.0  # measured prompt rows (both 0: unknown, per_token_ms)
    prefill_ms_per_row_position: float = 0.0  # a prompt row's attention, per position read

    def prefill_ms(self, tokens: int, context_before: int = 0) -> float:
        """What ``tokens`` prompt rows add to a step, the first of them at position
        ``context_before`` of its prompt (a prompt row runs the layers but neither sampling
        nor the codec, so it costs far less than a decoding stream; its attention reads every
        position up to its own)."""
        rows = max(tokens, 0)
        measured = self.prefill_ms_per_token > 0 or self.prefill_ms_per_row_position > 0
        per_token = self.prefill_ms_per_token if measured else self.per_token_ms
        positions = rows * (max(context_before, 0) + (rows + 1) / 2.0)
        return per_token * rows + self.prefill_ms_per_row_position * positions

    def prefill_rows_within(self, budget_ms: float, context_before: int = 0) -> int:
        """The most prompt rows, the first at position ``context_before``, whose
        :meth:`prefill_ms` fits ``budget_ms`` (0 when none does)."""
        if budget_ms <= 0:
            return 0
        per_token = self.prefill_ms_per_token or self.per_token_ms
        quadratic = self.prefill_ms_per_row_position / 2.0
        linear = per_token + self.prefill_ms_per_row_position * (max(context_before, 0) + 0.5)
        if quadratic <= 0:
            if linear <= 0:
                return _UNBOUNDED_ROWS
            estimate = budget_ms / linear
        else:
            discriminant = linear * linear + 4.0 * quadratic * budget_ms
            estimate = (math.sqrt(discriminant) - linear) / (2.0 * quadratic)
        rows = int(estimate)
        # float rounding at the boundary, either way
        while rows > 0 and self.prefill_ms(rows, context_before) > budget_ms:
            rows -= 1
        while self.prefill_ms(rows + 1, context_before) <= budget_ms:
            rows += 1
        return rows

    def predict_ms(self, tokens: int, context_tokens: int) -> float:
        points = self.decode_points
        if not points or tokens <= 0:
            return (
                self.fixed_ms
                + self.per_token_ms * max(tokens, 0)
                + self.per_kilocontext_ms * context_tokens / 1000.0
            )
        base_ms, base_context = _interpolate(points, tokens, self.per_token_ms)
        return base_ms + self.per_kilocontext_ms * (context_tokens - base_context) / 1000.0

    def max_batch(self, budget_ms: float, context_per_stream: int, limit: int) -> int:
        """The most decoding streams (up to ``limit``) whose step fits ``budget_ms``."""
        best = 0
        for batch in range(1, limit + 1):
            if self.predict_ms(batch, batch * context_per_stream) > budget_ms:
                break
            best = batch
        return best

    @classmethod
    def fit(
        cls,
        samples: Sequence[StepSample],
        long_context: StepSample | None = None,
        prefill_ms_per_token: float = 0.0,
        prefill_ms_per_row_position: float = 0.0,
    ) -> StepTimeModel:
        """The model of pure-decode ``samples`` at short context (one or more batch sizes)
        and, optionally, one ``long_context`` sample that fixes the attention term, and the
        measured cost of a prompt row (:meth:`prefill_ms`)."""
        if not samples:
            raise ValueError("no step samples to fit")
        line = _least_squares(list(samples) + ([long_context] if long_context else []))
        points: list[tuple[int, int, float]] = []
        for sample in sorted(samples, key=lambda s: s.tokens):
            # Monotone: a noisy point never predicts a smaller step for more streams.
            ms = max(sample.ms, points[-1][2] if points else 0.0)
            points.append((sample.tokens, sample.context_tokens, ms))
        # Without a long-context point the context term cannot be told apart from the number
        # of streams (the sweep's context grows with it), so attention stays folded into the
        # per-stream points.
        per_context = 0.0
        if long_context is not None:
            short_ms, short_context = _interpolate(tuple(points), long_context.tokens, 0.0)
            extra = (long_context.context_tokens - short_context) / 1000.0
            if extra > 0:
                per_context = max((long_context.ms - short_ms) / extra, 0.0)
        slope = line.per_token_ms
        if len(points) >= 2:
            (t0, _, ms0), (t1, _, ms1) = points[-2], points[-1]
            slope = max(slope, (ms1 - ms0) / (t1 - t0))
        return cls(
            fixed_ms=line.fixed_ms,
            per_token_ms=slope,
            per_kilocontext_ms=per_context,
            decode_points=tuple(points),
            prefill_ms_per_token=prefill_ms_per_token,
            prefill_ms_per_row_position=prefill_ms_per_row_position,
        )


def _interpolate(
    points: tuple[tuple[int, int, float], ...], tokens: int, slope_ms: float
) -> tuple[float, float]:
    """``(ms, context)`` at ``tokens`` streams along the measured points; linear between them,
    ``slope_ms`` per stream outside them (context scaled per stream)."""
    first, last = points[0], points[-1]
    if tokens <= first[0]:
        return first[2] - slope_ms * (first[0] - tokens), first[1] * tokens / first[0]
    if tokens >= last[0]:
        return last[2] + slope_ms * (tokens - last[0]), last[1] * tokens / last[0]
    for (t0, c0, ms0), (t1, c1, ms1) in itertools.pairwise(points):
        if t0 <= tokens <= t1:
            share = (tokens - t0) / (t1 - t0)
            return ms0 + share * (ms1 - ms0), c0 + share * (c1 - c0)
    raise AssertionError("unreachable: points are sorted")


def _least_squares(samples: list[StepSample]) -> StepTimeModel:
    """``fixed + per_token * tokens + per_kilocontext * context`` by
    :func:`nonnegative_least_squares`."""
    fixed, per_token, per_kilocontext = nonnegative_least_squares(
        [
            np.ones(len(samples)),
            np.array([s.tokens for s in samples], dtype=float),
            np.array([s.context_tokens / 1000.0 for s in samples], dtype=float),
        ],
        np.array([s.ms for s in samples], dtype=float),
    )
    return StepTimeModel(fixed_ms=fixed, per_token_ms=per_token, per_kilocontext_ms=per_kilocontext)


def nonnegative_least_squares(columns: list[np.ndarray], target: np.ndarray) -> list[float]:
    """The coefficients of ``columns`` that best fit ``target`` (least squares), none
    negative: the most negative one is dropped and the rest refitted until none is (a dropped
    column's coefficient is 0). Times are sums of costs that cannot be negative; a noisy
    measurement must not make one so."""
    active = list(range(len(columns)))
    while True:
        design = np.stack([columns[i] for i in active], axis=1)
        solution, *_ = np.linalg.lstsq(design, target, rcond=None)
        coefficients = dict(zip(active, solution.tolist(), strict=True))
        negative = [i for i in active if coefficients[i] < 0]
        if not negative or len(active) == 1:
            break
        active.remove(min(negative, key=lambda i: coefficients[i]))
    return [max(coefficients.get(i, 0.0), 0.0) for i in range(len(columns))]
