"""The admission gate every stream passes before it reaches the engine, whatever its transport.

``ticket = await gate.acquire(priority, cost)`` returns once the stream may start (at once when
nobody is waiting and :class:`CapacityModel` says it fits; otherwise after waiting in its
class's queue) and raises :class:`AdmissionRefused` with a reason and a ``Retry-After``
estimate when it may not: its queue is full, it waited its class's maximum (or is expected to
wait longer than that, then it is refused at once instead of after the wait), or it could
never fit. ``gate.release(ticket)`` when the stream's engine request has ended lets the next
waiter in.

Retry-After estimates come from the admitted streams' expected ends (admission time plus their
audio length at the real-time budget): a request ``k``-th in line can expect to start when the
``k``-th of them ends.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from cadenza.config import AdmissionConfig
from cadenza.contract.calibration import CALIBRATION_ADAPTER
from cadenza.contract.errors import ENGINE_RETRY_AFTER_S
from cadenza.contract.messages import Stats
from cadenza.edge.admission.capacity import AdmittedLoad, CapacityModel, StreamCost
from cadenza.edge.admission.priority_queues import PRIORITIES, Priority, PriorityQueues, Waiter
from cadenza.edge.metrics import ModelMetrics

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
    priority: Priority
    cost: StreamCost
    admitted_at: float
    waited_s: float
    expected_end: float


class AdmissionGate:
    def __init__(
        self,
        config: AdmissionConfig,
        capacity: CapacityModel,
        metrics: ModelMetrics,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self.capacity = capacity
        self.metrics = metrics
        self.clock = clock
        self.queues = PriorityQueues(
            config.aging_s,
            {"standard": config.standard_reserved_share, "batch": config.batch_reserved_share},
        )
        self.active: set[Ticket] = set()
        self._granted: dict[Waiter, Ticket] = {}  # admitted waiters that have not resumed yet
        self._max_wait = {
            "realtime": config.realtime_max_wait_s,
            "standard": config.standard_max_wait_s,
            "batch": config.batch_max_wait_s,
        }

    # -- the stream's side -----------------------------------------------------------------------

    async def acquire(
        self, priority: Priority, cost: StreamCost, on_queued: QueuedCallback | None = None
    ) -> Ticket:
        """Wait until the stream may start; raises :class:`AdmissionRefused`."""
        if cost.kv_pages > self.capacity.info.kv_pages_total:
            self._count(priority, "refused", "too_large")
            raise AdmissionRefused(
                "too_large",
                f"request needs about {cost.kv_pages} KV pages; the server has "
                f"{self.capacity.info.kv_pages_total} (ask for a shorter max_duration_s)",
                0.0,
            )
        now = self.clock()
        if not self.queues and self._refusal(cost) is None:
            self._count(priority, "admitted", "immediate")
            return self._admit(priority, cost, None)
        if self.queues.depth(priority) >= self.config.max_queue_length:
            retry = self._retry_after_s(len(self.queues) + 1)
            self._count(priority, "refused", "queue_full")
            raise AdmissionRefused(
                "queue_full", f"server at capacity and the {priority} queue is full", retry
            )
        expected_wait = self._expected_wait_s(len(self.queues) + 1)
        if expected_wait > self._max_wait[priority]:
            cause = self._refusal(cost) or "behind_others"
            self._count(priority, "refused", "queue_timeout")
            raise AdmissionRefused(
                "queue_timeout",
                f"server at capacity ({cause}): no {priority} slot expected within "
                f"{self._max_wait[priority]:g} s",
                max(expected_wait, 1.0),
            )
        waiter = Waiter(priority, cost, now)
        self.queues.push(waiter)
        self._count(priority, "queued", self._refusal(cost) or "behind_others")
        self._dispatch()
        try:
            if not waiter.admitted.done() and on_queued is not None:
                position = self.queues.position(waiter, now)
                await on_queued(position, self._retry_after_s(position))
            async with asyncio.timeout(self._max_wait[priority]):
                await asyncio.shield(waiter.admitted)
        except TimeoutError:
            if not waiter.admitted.done():
                self.queues.remove(waiter)
                waiter.admitted.cancel()
                self._dispatch()  # whoever waited behind it may fit
                position = len(self.queues) + 1
                self._count(priority, "refused", "queue_timeout")
                raise AdmissionRefused(
                    "queue_timeout",
                    f"server at capacity: no {priority} slot within {self._max_wait[priority]:g} s",
                    self._retry_after_s(position),
                ) from None
        except BaseException:
            # Cancelled while waiting (the client left): give the slot back if it was granted.
            self.queues.remove(waiter)
            if waiter.admitted.done() and not waiter.admitted.cancelled():
                self._release_waiter(waiter)
            else:
                waiter.admitted.cancel()
            self._dispatch()
            raise
        waiter.admitted.result()  # the refusal, if the gate failed it as the wait timed out
        ticket = self._granted.pop(waiter)
        self.metrics.queue_wait.labels(priority=priority).observe(ticket.waited_s)
        return ticket

    def fail_waiting(self, message: str) -> None:
        """Refuse every waiting request at once (the engine is gone: nothing will free up)."""
        for waiter in list(self.queues):
            self.queues.remove(waiter)
            if not waiter.admitted.done():
                self._count(waiter.priority, "refused", "engine_unavailable")
                waiter.admitted.set_exception(
                    AdmissionRefused("engine_unavailable", message, ENGINE_RETRY_AFTER_S)
                )
        self.update_gauges()

    def release(self, ticket: Ticket) -> None:
        """The stream's engine request has ended; let the next waiter in."""
        self.active.discard(ticket)
        self._dispatch()

    # -- capacity changes -----------------------------------------------------------------------

    def on_engine_stats(self, message: Stats) -> None:
        """Fold an engine report into the capacity model, then admit whoever now fits."""
        self.capacity.observe(message)
        self._dispatch()

    def snapshot(self) -> dict[str, Any]:
        """The body of ``GET /v1/capacity``."""
        active = len(self.active)
        now = self.clock()
        return {
            "max_streams": self.capacity.max_streams(),
            "active": active,
            "queued": len(self.queues),
            "kv_pages_total": self.capacity.info.kv_pages_total,
            "kv_pages_free": self.capacity.kv_pages_free,
            "step_ms_p50": round(self.capacity.step_ms_p50(active), 3),
            "rtf_headroom": round(self.capacity.rtf_headroom(active), 4),
            "admission_open": self.capacity.admission_open,
            "queues": {
                p: {
                    "depth": self.queues.depth(p),
                    "oldest_wait_s": round(self.queues.oldest_age_s(p, now), 3),
                }
                for p in PRIORITIES
            },
            "limits": {
                "realtime": self.capacity.realtime_limit(),
                "kv_memory": self.capacity.kv_limit(),
                "max_num_seqs": self.capacity.info.max_num_seqs,
            },
            "step_budget_ms": round(self.capacity.step_budget_ms, 3),
            "step_correction": round(self.capacity.correction, 4),
            "realtime_factor": round(self.capacity.realtime_factor(), 4),
            "calibration": None
            if self.capacity.info.calibration is None
            else CALIBRATION_ADAPTER.dump_python(self.capacity.info.calibration, mode="json"),
        }

    # -- internals ------------------------------------------------------------------------------

    def _load(self) -> AdmittedLoad:
        """The admitted streams as admission weighs one more (contexts from each stream's
        shape and how long it has run at the frame rate)."""
        now = self.clock()
        info = self.capacity.info
        rate = info.frame_rate * info.shape.steps_per_frame  # decode steps per second
        ttfa_s = self.capacity.engine_config.ttfa_target_ms / 1000.0
        contexts_now = [
            min(
                t.cost.final_context,
                t.cost.prompt_tokens + int((now - t.admitted_at) * rate),
            )
            for t in self.active
        ]
        recent = [t for t in self.active if t.admitted_at >= now - ttfa_s]
        return AdmittedLoad(
            streams=len(self.active),
            kv_pages=sum(t.cost.kv_pages for t in self.active),
            prefilling_tokens=sum(t.cost.prompt_tokens for t in recent),
            prefilling_streams=len(recent),
            longest_final_context=max((t.cost.final_context for t in self.active), default=0),
            longest_context_now=max(contexts_now, default=0),
        )

    def _refusal(self, cost: StreamCost) -> str | None:
        return self.capacity.refusal(self._load(), cost)

    def _admit(self, priority: Priority, cost: StreamCost, enqueued_at: float | None) -> Ticket:
        """A ticket for an admitted stream (``enqueued_at``: when it started waiting, if it
        did)."""
        now = self.clock()
        waited = 0.0 if enqueued_at is None else now - enqueued_at
        rate = 1.0 - self.capacity.engine_config.realtime_headroom
        ticket = Ticket(priority, cost, now, waited, now + cost.audio_s * rate)
        self.active.add(ticket)
        self.update_gauges()
        return ticket

    def _dispatch(self) -> None:
        """Admit waiters, in queue order, while the next one fits."""
        while True:
            now = self.clock()
            active: Counter[str] = Counter(t.priority for t in self.active)
            waiter = self.queues.peek(now, active, self.capacity.max_streams())
            if waiter is None or self._refusal(waiter.cost) is not None:
                break
            self.queues.remove(waiter)
            ticket = self._admit(waiter.priority, waiter.cost, waiter.enqueued_at)
            self._granted[waiter] = ticket
            waiter.admitted.set_result(None)
            self._count(waiter.priority, "admitted", "after_wait")
        self.update_gauges()

    def _release_waiter(self, waiter: Waiter) -> None:
        ticket = self._granted.pop(waiter, None)
        if ticket is not None:
            self.release(ticket)

    def _retry_after_s(self, position: int) -> float:
        """When the ``position``-th request in line can expect to start (at least 1 s: what a
        ``Retry-After`` header can say)."""
        return max(self._expected_wait_s(position), 1.0)

    def _expected_wait_s(self, position: int) -> float:
        """Seconds until the ``position``-th request in line can expect to start, from the
        admitted streams' expected ends (0 when nothing is admitted)."""
        now = self.clock()
        ends = sorted(max(t.expected_end - now, 0.0) for t in self.active)
        if not ends:
            return 0.0
        if position <= len(ends):
            return ends[position - 1]
        rounds = math.ceil(position / len(ends))
        longest = max(t.cost.audio_s for t in self.active)
        return ends[-1] + (rounds - 1) * longest

    def _count(self, priority: str, decision: str, reason: str) -> None:
        self.metrics.admission_decisions.labels(
            priority=priority, decision=decision, reason=reason
        ).inc()

    def update_gauges(self) -> None:
        """Refresh the queue and capacity gauges (queue ages grow while nothing happens)."""
        now = self.clock()
        for priority in PRIORITIES:
            self.metrics.queue_depth.labels(priority=priority).set(self.queues.depth(priority))
            self.metrics.queue_oldest_age.labels(priority=priority).set(
                self.queues.oldest_age_s(priority, now)
            )
        self.metrics.streams_admitted.set(len(self.active))
        self.metrics.max_streams.set(self.capacity.max_streams())
        self.metrics.admission_open.set(1 if self.capacity.admission_open else 0)
        self.metrics.realtime_factor.set(self.capacity.realtime_factor())
