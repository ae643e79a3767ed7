"""Whether the prompts admitted to one replica, and one more, can all be prefilled in time for
their first chunks: the engine's prompt order, replayed at the edge.

The engine prefills prompts in the time its steps leave free, earliest first-chunk deadline
first (:meth:`DeadlinePolicy.prefill_order`), a deadline being the TTFA target after arrival,
later for a long prompt (:meth:`RealtimePlan.first_chunk_due_after_s`). Admission replays that
with what it knows: each admitted prompt's release (its admission), its work (its rows'
calibrated prefill time times the realtime factor) and the moment its prefill must be done
(its first chunk's deadline less the steps the first chunk itself takes). Prefill runs at
``rate`` ms of work per ms of wall time (the share of each step period the decoding streams
leave), plus ``lent_ms`` that the playing streams' lead lends at once::

    pending      A [=====......]  due 0.45 s      by deadline:  B, A, new
                 B [==.]          due 0.20 s      finish B 0.05, A 0.31, new 0.36
    new              [===]        due 0.40 s      -> A is late on its own; new fits: admit

A prompt is a *reason to refuse* only when it would finish after its own deadline, or would
push a prompt that was on time past its deadline; one already late without it does not count
against it (the engine serves the earlier deadline first either way).

Pure functions; times in seconds, work in milliseconds.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Prompt:
    """One prompt to prefill: released (admitted) at ``released_s``, ``work_ms`` of prefill
    at the replica's current speed, to be done by ``due_s``."""

    released_s: float
    work_ms: float
    due_s: float


def remaining_ms(prompts: Sequence[Prompt], rate: float, now_s: float) -> list[float]:
    """What is left of each prompt's work at ``now_s``, had the engine prefilled them since
    their releases at ``rate``, the earliest deadline first (preemptive: a prompt released
    later with an earlier deadline goes ahead of one already started)."""
    left = [p.work_ms for p in prompts]
    if rate <= 0:
        return left
    moments = sorted({p.released_s for p in prompts if p.released_s < now_s} | {now_s})
    for start, end in itertools.pairwise(moments):
        budget_ms = 1000.0 * (end - start) * rate  # no release in between: one order
        while budget_ms > 0:
            ready = [i for i, p in enumerate(prompts) if p.released_s <= start and left[i] > 0]
            if not ready:
                break
            first = min(ready, key=lambda i: (prompts[i].due_s, left[i]))
            done_ms = min(left[first], budget_ms)
            left[first] -= done_ms
            budget_ms -= done_ms
    return left


def finish_times(
    prompts: Sequence[Prompt], left_ms: Sequence[float], rate: float, lent_ms: float, now_s: float
) -> list[float]:
    """When each prompt with ``left_ms`` of work still to do is done, prefilled from
    ``now_s`` by deadline (then least work first) at ``rate``, the first ``lent_ms`` of
    work at once (``now_s`` for a prompt with nothing left; ``inf`` at a rate of 0)."""
    order = sorted(range(len(prompts)), key=lambda i: (prompts[i].due_s, left_ms[i]))
    finish = [now_s] * len(prompts)
    total = 0.0
    for i in order:
        if left_ms[i] <= 0:
            continue
        total += left_ms[i]
        beyond_ms = max(total - lent_ms, 0.0)
        if beyond_ms <= 0:
            finish[i] = now_s
        else:
            finish[i] = now_s + beyond_ms / (1000.0 * rate) if rate > 0 else float("inf")
    return finish


def lateness_s(
    pending: Sequence[Prompt], new: Prompt, rate: float, lent_ms: float, now_s: float
) -> float:
    """How late ``new`` (released now) would make the latest prompt it is to blame for: its
    own finish past its deadline, or a pending prompt's that was on time without it; 0 or
    less: it fits."""
    left = remaining_ms(pending, rate, now_s)
    before = finish_times(pending, left, rate, lent_ms, now_s)
    after = finish_times([*pending, new], [*left, new.work_ms], rate, lent_ms, now_s)
    worst = after[-1] - new.due_s
    for prompt, was, now in zip(pending, before, after[:-1], strict=True):
        if was <= prompt.due_s:
            worst = max(worst, now - prompt.due_s)
    return worst
