"""Requests waiting for capacity: one bounded queue per priority class, with aging.

Which waiter goes next when capacity frees up:

1. a class below its *reserved share* of ``max_streams`` (``standard`` and ``batch`` by
   default) that has waiters goes first, so a flood of a higher class cannot starve it;
2. otherwise the waiter with the highest *effective priority*, its class rank (``realtime`` 2,
   ``standard`` 1, ``batch`` 0) plus one per ``aging_s`` seconds waited; ties go to the one
   that waited longest.

Within a class the order is first come, first served.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Literal

from cadenza.edge.admission.capacity import StreamCost

Priority = Literal["realtime", "standard", "batch"]
PRIORITIES: tuple[Priority, ...] = ("realtime", "standard", "batch")
_RANK: dict[str, int] = {"realtime": 2, "standard": 1, "batch": 0}


@dataclass(eq=False)
class Waiter:
    priority: Priority
    cost: StreamCost
    enqueued_at: float
    prefix: str | None = None  # the prompt-prefix key placement prefers a replica by
    held_by: str | None = None  # why it could not start when last looked at (a refusal code)
    admitted: asyncio.Future[None] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )


class PriorityQueues:
    def __init__(self, aging_s: float, reserved_share: Mapping[str, float]) -> None:
        self.aging_s = aging_s
        self.reserved_share = dict(reserved_share)
        self._queues: dict[str, deque[Waiter]] = {p: deque() for p in PRIORITIES}

    def __len__(self) -> int:
        return sum(len(q) for q in self._queues.values())

    def __iter__(self) -> Iterator[Waiter]:
        for priority in PRIORITIES:
            yield from self._queues[priority]

    def depth(self, priority: str) -> int:
        return len(self._queues[priority])

    def oldest_age_s(self, priority: str, now: float) -> float:
        queue = self._queues[priority]
        return now - queue[0].enqueued_at if queue else 0.0

    def push(self, waiter: Waiter) -> None:
        self._queues[waiter.priority].append(waiter)

    def remove(self, waiter: Waiter) -> None:
        queue = self._queues[waiter.priority]
        if waiter in queue:
            queue.remove(waiter)

    def effective_priority(self, waiter: Waiter, now: float) -> float:
        return _RANK[waiter.priority] + (now - waiter.enqueued_at) / self.aging_s

    def peek(self, now: float, active: Mapping[str, int], max_streams: int) -> Waiter | None:
        """The waiter that should start next (not removed)."""
        heads = [q[0] for q in self._queues.values() if q]
        if not heads:
            return None
        starved = [
            w
            for w in heads
            if active.get(w.priority, 0) < self.reserved_share.get(w.priority, 0.0) * max_streams
        ]
        candidates = starved or heads
        return max(
            candidates,
            key=lambda w: (self.effective_priority(w, now), now - w.enqueued_at),
        )

    def position(self, waiter: Waiter, now: float) -> int:
        """1-based place in the order :meth:`peek` would serve everyone now (ignoring shares)."""
        ahead = sum(
            1
            for other in self
            if other is not waiter
            and (self.effective_priority(other, now), now - other.enqueued_at)
            > (self.effective_priority(waiter, now), now - waiter.enqueued_at)
        )
        return ahead + 1
