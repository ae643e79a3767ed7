"""What the admission gate hands out: a :class:`Ticket` for an admitted stream (its class, its
cost, when it was admitted and is expected to end, the replica serving it), or an
:class:`AdmissionRefused` with the reason and a ``Retry-After`` estimate."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from cadenza.edge.admission.capacity import StreamCost
from cadenza.edge.admission.priority_queues import Priority

QueuedCallback = Callable[[int, float], Awaitable[None]]
"""Awaited once when a request has to wait, with its 1-based position and estimated wait (s)."""


class AdmissionRefused(Exception):
    """A stream may not start. ``code``: ``queue_full``, ``queue_timeout``, ``too_large``,
    ``engine_unavailable``."""

    def __init__(self, code: str, message: str, retry_after_s: float) -> None:
        super().__init__(message)
        self.code = code
        self.retry_after_s = retry_after_s


@dataclass(eq=False)
class Ticket:
    """An admitted stream: its ``priority`` and ``cost``, when it was admitted (after waiting
    ``waited_s``) and is expected to end (monotonic seconds)."""

    priority: Priority
    cost: StreamCost
    admitted_at: float
    waited_s: float
    expected_end: float
    replica: int | None = 0  # the engine replica serving it; None while that one is lost
