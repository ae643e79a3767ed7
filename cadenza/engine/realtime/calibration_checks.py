"""Whether a calibration agrees with itself: a sweep taken while something else loaded the
machine must not become the step-time model every later start uses.

Three checks, each a bound on disagreement that a quiet machine stays well within (every
point's two measurements, and a whole sweep's points against each other), all scaled by one
``tolerance`` (``calibration.tolerance``):

* **repeats**: each point is measured twice (on the way up and on the way down); the slower
  may exceed the faster by at most ``tolerance``;
* **the cores its own**: while timing each point the engine must have had at least
  ``1 -`` :data:`SHARE_OF_TOLERANCE` ``* tolerance`` of its cores' time (its CPU time over
  wall time times its threads: 65 % at the default tolerance; a quiet sweep here got 76-100 %,
  one beside two busy loops 46-50 %); a busy loop on its core slows every point alike, which
  the other checks cannot see;
* **order**: a larger batch's step may be faster than a smaller one's by at most that much
  (the model forces its points monotone; a large correction hides a busy moment);
* **slopes**: what each further stream adds between neighbouring points may exceed the median
  of those increments at most :data:`SLOPE_FACTOR` ``* (1 + tolerance)`` times (plus
  :data:`SLOPE_SLACK_MS`): a point measured while the cores were taken shows as one steep
  segment, and the last segment's slope is what the model extrapolates with.

:func:`load_or_calibrate` measures again (``calibration.attempts`` in all) while a sweep
has problems, except after one whose cores were taken (:func:`cores_taken`: another would
most likely meet the same neighbour); if no attempt agrees, the engine serves with
:func:`conservative` (never cached), says so in its log and, through the calibration it
announces, in ``/readyz``, and measures again once it has been idle a while on a quiet
machine (:mod:`cadenza.engine.realtime.remeasure`).
"""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Sequence
from dataclasses import replace

from cadenza.contract.arrival_wave import WavePoint
from cadenza.contract.calibration import Calibration, StepRepeat
from cadenza.contract.step_time_model import StepSample, StepTimeModel

SHARE_OF_TOLERANCE = 0.7
SLOPE_FACTOR = 3.0
SLOPE_SLACK_MS = 0.1
CONSERVATIVE_JITTER = 1.5  # what a calibration that contradicts itself allows for, at least


def calibration_problems(calibration: Calibration, tolerance: float) -> list[str]:
    """Every way ``calibration`` contradicts itself beyond ``tolerance`` (empty: none)."""
    problems = [
        f"{r.tokens} streams measured {r.first_ms:.2f} and {r.again_ms:.2f} ms a step "
        f"({r.spread:.0%} apart)"
        for r in calibration.repeats
        if r.spread > tolerance
    ]
    problems += [
        f"the engine had {r.cpu_share:.0%} of its cores' time while measuring {r.tokens} "
        "streams (something else ran on them)"
        for r in calibration.repeats
        if r.cpu_share < 1 - SHARE_OF_TOLERANCE * tolerance
    ]
    points = sorted(_decode_samples(calibration), key=lambda s: s.tokens)
    for smaller, larger in itertools.pairwise(points):
        if larger.ms * (1 + tolerance) < smaller.ms:
            problems.append(
                f"{larger.tokens} streams ({larger.ms:.2f} ms) ran faster than "
                f"{smaller.tokens} ({smaller.ms:.2f} ms)"
            )
    slopes = [
        (b.tokens, (b.ms - a.ms) / (b.tokens - a.tokens)) for a, b in itertools.pairwise(points)
    ]
    if len(slopes) >= 3:
        typical = statistics.median(max(slope, 0.0) for _, slope in slopes)
        limit = SLOPE_FACTOR * (1 + tolerance) * typical + SLOPE_SLACK_MS
        problems += [
            f"the step grows {slope:.2f} ms a stream up to {tokens} streams, against "
            f"{typical:.2f} typically"
            for tokens, slope in slopes
            if slope > limit
        ]
    return problems


def _decode_samples(calibration: Calibration) -> list[StepSample]:
    """The sweep's short-context points (they come first; the long-context one, if any,
    last)."""
    return list(calibration.samples[: len(calibration.model.decode_points)])


def _long_sample(calibration: Calibration) -> StepSample | None:
    extra = calibration.samples[len(calibration.model.decode_points) :]
    return extra[0] if extra else None


def conservative(attempts: Sequence[Calibration]) -> Calibration:
    """One calibration from sweeps that each contradicted themselves: every point at its
    fastest measurement in any of them (noise only ever slows a step), refitted, with a
    jitter of at least :data:`CONSERVATIVE_JITTER` so that admission starts well below what
    the points suggest, and every attempt's problems kept (it is never cached)."""
    if not attempts:
        raise ValueError("no calibration attempts to combine")
    fastest: dict[int, StepSample] = {}
    for attempt in attempts:
        for sample in _decode_samples(attempt):
            if sample.tokens not in fastest or sample.ms < fastest[sample.tokens].ms:
                fastest[sample.tokens] = sample
    decode = [fastest[tokens] for tokens in sorted(fastest)]
    longs = [s for s in map(_long_sample, attempts) if s is not None]
    long = min(longs, key=lambda s: s.ms) if longs else None
    last = attempts[-1]
    model = StepTimeModel.fit(
        decode,
        long,
        min(a.model.prefill_ms_per_token for a in attempts),
        min(a.model.prefill_ms_per_row_position for a in attempts),
    )
    problems = tuple(
        f"attempt {k + 1}: {problem}"
        for k, attempt in enumerate(attempts)
        for problem in attempt.problems
    )
    repeats: tuple[StepRepeat, ...] = tuple(r for a in attempts for r in a.repeats)
    return replace(
        last,
        model=model,
        samples=tuple(decode) + ((long,) if long is not None else ()),
        jitter=max(CONSERVATIVE_JITTER, *(a.jitter for a in attempts)),
        throughput_streams=max(a.throughput_streams for a in attempts),
        long_context_throughput_streams=max(a.long_context_throughput_streams for a in attempts),
        repeats=repeats,
        attempts=len(attempts),
        problems=problems,
        waves=_best_waves(attempts),
    )


def _best_waves(attempts: Sequence[Calibration]) -> tuple[WavePoint, ...]:
    """Every measured wave size at its best factor in any attempt (as the points: the
    fastest each was seen), with the longest span."""
    best: dict[int, WavePoint] = {}
    for attempt in attempts:
        for wave in attempt.waves:
            seen = best.get(wave.streams, wave)
            best[wave.streams] = WavePoint(
                wave.streams,
                max(wave.max_factor, seen.max_factor),
                max(wave.span_s, seen.span_s),
            )
    return tuple(best[streams] for streams in sorted(best))


def cores_taken(calibration: Calibration, tolerance: float) -> bool:
    """Whether ``calibration`` was measured while something else ran on the engine's cores
    (its *cores its own* check failed at some point): another sweep right away would most
    likely measure the same neighbour, so the start goes on with :func:`conservative` and
    measures again once the machine is quiet (``calibration.remeasure_idle_s``)."""
    return any(r.cpu_share < 1 - SHARE_OF_TOLERANCE * tolerance for r in calibration.repeats)
