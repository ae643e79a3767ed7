"""Where a stream starts among a model's replicas: the load admission weighs on each, and the
rule that picks one (pure functions; the gate keeps the state)."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from cadenza.edge.admission.capacity import (
    AdmittedLoad,
    CapacityModel,
    RunningStream,
    StreamCost,
)

# Holds that clear by themselves within a fraction of a second, with no stream ending: the
# prompts admitted before a stream being prefilled, the streams it would start with aging past
# their wave's span. A stream held only by these waits that long instead of being refused.
SHORT_HOLDS = frozenset({"prefill_budget", "arrival_wave"})


@dataclass(frozen=True)
class Placement:
    """Where a stream goes (``replica``), or why it cannot start now (``reason``) and, when
    only a short hold (:data:`SHORT_HOLDS`) keeps it, about how soon it could
    (``hold_wait_s``)."""

    replica: int | None
    reason: str | None = None
    hold_wait_s: float = math.inf


def admitted_load(
    streams: Iterable[tuple[StreamCost, float]], now: float, step_period_s: float
) -> AdmittedLoad:
    """A replica's admitted ``streams`` (each its cost and admission time) as admission
    weighs one more: contexts from each stream's shape and how long it has run at the step
    period."""
    streams = list(streams)
    contexts_now = [
        min(cost.final_context, cost.prompt_tokens + int((now - admitted_at) / step_period_s))
        for cost, admitted_at in streams
    ]
    return AdmittedLoad(
        streams=len(streams),
        kv_pages=sum(cost.kv_pages for cost, _ in streams),
        longest_final_context=max((cost.final_context for cost, _ in streams), default=0),
        longest_context_now=max(contexts_now, default=0),
        running=tuple(
            RunningStream(now - admitted_at, cost.prompt_tokens, cost.final_context)
            for cost, admitted_at in streams
        ),
    )


def place(
    replicas: dict[int, CapacityModel],
    placeable: Iterable[int],
    load_on: Callable[[int], AdmittedLoad],
    cost: StreamCost,
    served_prefix: Callable[[int], bool],
) -> Placement:
    """The replica a stream of ``cost`` should start on, or ``None`` and why none can take it
    now (and, held only by a short hold, how soon one could): the most real-time headroom, then
    one that served its prompt prefix lately (``served_prefix``), then the fewest streams,
    then the lowest index."""
    candidates = sorted(placeable)
    best: int | None = None
    best_key: tuple[int, bool, int, int] | None = None
    reason: str | None = None if candidates else "engine_unavailable"
    hold_wait_s = math.inf
    short_hold: str | None = None
    for index in candidates:
        capacity, load = replicas[index], load_on(index)
        why = capacity.refusal(load, cost)
        if why is not None:
            reason = reason or why
            if why in SHORT_HOLDS:
                if why == "prefill_budget":
                    wait = capacity.prefill_lateness_s(load, cost)
                else:
                    wait = capacity.wave_wait_s(load)
                if wait < hold_wait_s:
                    hold_wait_s, short_hold = max(wait, 0.0), why
            continue
        final = max(load.longest_final_context or 0, cost.final_context)
        headroom = capacity.realtime_limit(final) - load.streams
        key = (headroom, served_prefix(index), -load.streams, -index)
        if best_key is None or key > best_key:
            best, best_key = index, key
    if best is not None:
        return Placement(best)
    if short_hold is not None:
        reason = short_hold  # some replica only waits for a short hold to clear
    return Placement(None, reason, hold_wait_s)
