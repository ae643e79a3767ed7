"""Measuring again, later: an engine serving with a conservative calibration runs its sweep
again once it has been idle a while, and keeps the result if it agrees with itself.

A start-up sweep taken while something else loaded the machine (a neighbour node calibrating
beside this one, a busy loop) contradicts itself; the engine then starts on a conservative
calibration rather than not at all (:func:`~cadenza.engine.realtime.calibration_checks.
conservative`), which costs it precision: admission prices its steps at what they cost under
contention. Once it has been idle for ``calibration.remeasure_idle_s`` (the neighbour is
likely done as well) it runs the same sweep (:func:`~cadenza.engine.realtime.calibration.
run_sweep`) on the serving engine. Anything that arrives for the engine stops the sweep at its
next step, as it stops a probe (:mod:`cadenza.engine.realtime.probe`): the sweep has no
interruption point of its own, so for its duration the engine's step raises
:class:`Interrupted` once, the sweep's own clean-up (every synthetic stream aborted, its pages
freed) runs on, and the engine is idle again, its conservative calibration back in place. A
sweep that agrees with itself replaces the calibration and is cached, as a start-up one is; one
that still disagrees is dropped and the wait doubles (:class:`RemeasureSchedule`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Literal, TypeGuard

from cadenza.contract.calibration import Calibration
from cadenza.contract.request import StreamOutput
from cadenza.engine.engine import Engine
from cadenza.engine.realtime.calibration import run_sweep
from cadenza.engine.realtime.calibration_cache import cache_path, write_cache
from cadenza.engine.serving_engine import ServingEngine

log = logging.getLogger(__name__)

MAX_BACKOFF = 16  # the longest wait after sweeps that disagreed, in idle periods

RemeasureOutcome = Literal["agreed", "disagreed", "interrupted"]


class Interrupted(Exception):
    """Something arrived for the engine while it measured (raised by its step, once)."""


@dataclass(frozen=True)
class Remeasured:
    """How a sweep ended; ``calibration``: the engine's calibration now (the new one when it
    ``agreed``, else the conservative one it kept)."""

    outcome: RemeasureOutcome
    calibration: Calibration


class RemeasureSchedule:
    """When an idle engine with a conservative calibration measures again: once it has been
    idle for ``idle_s`` (0: never), twice as long after each sweep that still disagreed (the
    machine is still busy: a sweep costs the neighbour its CPU too), up to
    :data:`MAX_BACKOFF` times; an interrupted sweep waits for the next idle spell."""

    def __init__(self, idle_s: float) -> None:
        self.idle_s = idle_s
        self.wait_s = idle_s

    def due(self, idle_for_s: float) -> bool:
        return self.idle_s > 0 and idle_for_s >= self.wait_s

    def ended(self, outcome: RemeasureOutcome) -> None:
        if outcome == "disagreed":
            self.wait_s = min(2 * self.wait_s, MAX_BACKOFF * self.idle_s)
        elif outcome == "agreed":
            self.wait_s = self.idle_s


def wants_remeasure(engine: ServingEngine) -> TypeGuard[Engine]:
    """``engine`` is a batching engine serving with a calibration that contradicted itself."""
    return (
        isinstance(engine, Engine)
        and engine.calibration is not None
        and not engine.calibration.consistent
    )


def remeasure(engine: Engine, interrupted: Callable[[], bool]) -> Remeasured:
    """Sweep ``engine`` (idle, serving with a conservative calibration) again, checking
    ``interrupted`` before every step; apply and cache the result if it agrees with itself.
    The engine is idle afterwards, whatever the outcome."""
    if engine.has_unfinished_requests():
        raise RuntimeError("measuring again needs an idle engine")
    kept = engine.calibration
    assert kept is not None, "only a calibrated engine measures again"
    step = engine.step
    stopped = False

    def step_unless_interrupted() -> list[StreamOutput]:
        nonlocal stopped
        if not stopped and interrupted():
            stopped = True
            raise Interrupted
        return step()

    # As at start-up: no step model while it measures (its steps would feed the online
    # correction of the one being replaced).
    engine.apply_calibration(None)
    engine.step = step_unless_interrupted  # type: ignore[method-assign]
    sweep: Calibration | None = None
    try:
        sweep = run_sweep(engine, kept.identity)
    except Interrupted:
        pass
    finally:
        del engine.step  # the class's own again
        engine.take_report()  # its steps are no live steps
        engine.apply_calibration(kept)  # until one that agrees replaces it
        if engine.has_unfinished_requests():
            log.error("a synthetic stream outlived the sweep that started it")
    if sweep is None:
        return Remeasured("interrupted", kept)
    if not sweep.consistent:
        log.warning(
            "measured again, still contradicting itself (the machine is busy): %s",
            "; ".join(sweep.problems),
        )
        return Remeasured("disagreed", kept)
    adopted = replace(sweep, attempts=kept.attempts + 1)
    engine.apply_calibration(adopted)
    write_cache(cache_path(engine, adopted.identity), adopted)
    log.info(
        "measured again on a quiet machine, in %.1f s: %s; jitter x%.2f",
        adopted.measured_s,
        ", ".join(f"{t} streams {ms:.2f} ms" for t, _, ms in adopted.model.decode_points),
        adopted.jitter,
    )
    return Remeasured("agreed", adopted)
