"""The admission gate every stream passes before it reaches the engine, whatever its transport.

``ticket = await gate.acquire(priority, cost)`` returns once the stream may start (at once when
nobody is waiting and :class:`CapacityModel` says it fits; otherwise after waiting in its
class's queue) and raises :class:`AdmissionRefused` with a reason and a ``Retry-After``
estimate when it may not: its queue is full, it waited its class's maximum (or is expected to
wait longer than that, then it is refused at once instead of after the wait), or it could
never fit. ``gate.release(ticket)`` when the stream's engine request has ended lets the next
waiter in.

A model may run on several engine replicas, each with its own :class:`CapacityModel`. A stream
is admitted when some *placeable* replica (ready, not draining) can take it, and goes to the one
with the most real-time headroom (ties: the one that recently served its prompt prefix, then
the least loaded); its ticket names that replica. When a replica is lost, its streams' tickets
stay admitted but lose their replica; :meth:`AdmissionGate.relocate` finds each a new one, ahead
of every waiter.

Retry-After estimates come from the admitted streams' expected ends (admission time plus their
audio length at the real-time budget): a request ``k``-th in line can expect to start when the
``k``-th of them ends.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import Counter, OrderedDict, deque
from collections.abc import Callable

from cadenza.config import AdmissionConfig
from cadenza.contract.engine_stats import StepReport
from cadenza.contract.errors import ENGINE_RETRY_AFTER_S
from cadenza.contract.messages import Stats
from cadenza.edge.admission.capacity import AdmittedLoad, CapacityModel, StreamCost
from cadenza.edge.admission.capacity_report import claim_evidence_of, snapshot_of
from cadenza.edge.admission.capacity_snapshot import CapacitySnapshot, ClaimEvidence
from cadenza.edge.admission.placement import SHORT_HOLDS, Placement, admitted_load, place
from cadenza.edge.admission.priority_queues import PRIORITIES, Priority, PriorityQueues, Waiter
from cadenza.edge.admission.ticket import AdmissionRefused, QueuedCallback, Ticket
from cadenza.edge.server.model_metrics import ModelMetrics

_PREFIXES_KEPT = 64  # recent prompt prefixes remembered per replica, for placement ties
_PREFILL_RECHECK_S = 0.005  # after the prompts ahead are expected prefilled


class AdmissionGate:
    def __init__(
        self,
        config: AdmissionConfig,
        capacity: CapacityModel,
        metrics: ModelMetrics,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self.capacity = capacity  # the model's: stream costs, and replica 0 until replaced
        self.replicas: dict[int, CapacityModel] = {0: capacity}
        self.placeable: set[int] = {0}
        self.metrics = metrics
        self.clock = clock
        self.queues = PriorityQueues(
            config.aging_s,
            {"standard": config.standard_reserved_share, "batch": config.batch_reserved_share},
        )
        self.active: set[Ticket] = set()
        self._granted: dict[Waiter, Ticket] = {}  # admitted waiters that have not resumed yet
        self._resuming: deque[tuple[Ticket, asyncio.Future[None]]] = deque()
        self._prefixes: dict[int, OrderedDict[str, None]] = {}
        self._recheck: asyncio.TimerHandle | None = None  # a dispatch once prompts are done
        self._max_wait = {
            "realtime": config.realtime_max_wait_s,
            "standard": config.standard_max_wait_s,
            "batch": config.batch_max_wait_s,
        }

    # -- the stream's side -----------------------------------------------------------------------

    async def acquire(
        self,
        priority: Priority,
        cost: StreamCost,
        on_queued: QueuedCallback | None = None,
        prefix: str | None = None,
    ) -> Ticket:
        """Wait until the stream may start; raises :class:`AdmissionRefused`. ``prefix``: a
        key for the stream's prompt prefix (placement prefers a replica that served it)."""
        if cost.kv_pages > self.capacity.info.kv_pages_total:
            self._count(priority, "refused", "too_large")
            raise AdmissionRefused(
                "too_large",
                f"request needs about {cost.kv_pages} KV pages; the server has "
                f"{self.capacity.info.kv_pages_total} (ask for a shorter max_duration_s)",
                0.0,
            )
        now = self.clock()
        placement = self._placement(cost, prefix)
        replica, cause = placement.replica, placement.reason
        if replica is not None and not self._resuming and self._may_overtake_queue():
            self._count(priority, "admitted", "immediate")
            return self._admit(priority, cost, None, replica, prefix)
        self.metrics.admission_holds.labels(reason=cause or "behind_others").inc()
        if self.queues.depth(priority) >= self.config.max_queue_length:
            retry = self._retry_after_s(len(self.queues) + 1)
            self._count(priority, "refused", "queue_full")
            raise AdmissionRefused(
                "queue_full", f"server at capacity and the {priority} queue is full", retry
            )
        expected_wait = self._expected_wait_s(len(self.queues) + 1)
        if cause in SHORT_HOLDS:  # held by prompts or a wave clearing, no stream's end
            expected_wait = min(expected_wait, placement.hold_wait_s)
        if expected_wait > self._max_wait[priority]:
            cause = cause or "behind_others"
            self._count(priority, "refused", "queue_timeout")
            raise AdmissionRefused(
                "queue_timeout",
                f"server at capacity ({cause}): no {priority} slot expected within "
                f"{self._max_wait[priority]:g} s",
                max(expected_wait, 1.0),
            )
        waiter = Waiter(priority, cost, now, prefix, held_by=cause)
        self.queues.push(waiter)
        self._count(priority, "queued", cause or "behind_others")
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

    # -- replicas ---------------------------------------------------------------------------

    def set_replica(self, index: int, capacity: CapacityModel) -> None:
        """Replica ``index`` is ready (again) with ``capacity``; new streams may go to it."""
        self.replicas[index] = capacity
        self.placeable.add(index)
        self._prefixes.pop(index, None)
        self._dispatch()

    def hold_replica(self, index: int) -> None:
        """No new stream goes to replica ``index`` (it drains); its streams run on."""
        self.placeable.discard(index)
        self.update_gauges()

    def replica_lost(self, index: int) -> list[Ticket]:
        """Replica ``index`` is gone: no stream goes to it, and its streams' tickets (still
        admitted) lose their replica until :meth:`relocate` gives them one. Returns them."""
        self.placeable.discard(index)
        self._prefixes.pop(index, None)
        orphans = [t for t in self.active if t.replica == index]
        for ticket in orphans:
            ticket.replica = None
        self.update_gauges()
        return orphans

    def streams_on(self, index: int) -> int:
        """Admitted streams served by replica ``index``."""
        return sum(1 for t in self.active if t.replica == index)

    async def admit_resumed(self, priority: Priority, cost: StreamCost, timeout_s: float) -> Ticket:
        """A ticket for a stream another node started and lost (its client resumes it here):
        placed as a stream whose replica was lost is, ahead of every waiter, within
        ``timeout_s``; :class:`AdmissionRefused` ``engine_unavailable`` otherwise."""
        now = self.clock()
        rate = 1.0 - self.capacity.plan.headroom
        ticket = Ticket(priority, cost, now, 0.0, now + cost.audio_s * rate, replica=None)
        self.active.add(ticket)
        try:
            await self.relocate(ticket, timeout_s)
        except BaseException:
            self.release(ticket)
            self._count(priority, "refused", "resume_no_room")
            raise
        self._count(priority, "admitted", "resumed")
        self.update_gauges()
        return ticket

    async def relocate(self, ticket: Ticket, timeout_s: float) -> int:
        """A replica for an admitted stream whose replica was lost: the first placeable one
        it fits on, ahead of every waiter; :class:`AdmissionRefused` ``engine_unavailable``
        when none has room within ``timeout_s``."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (ticket, future)
        self._resuming.append(entry)
        self._dispatch()
        try:
            async with asyncio.timeout(timeout_s):
                await asyncio.shield(future)
        except TimeoutError:
            raise AdmissionRefused(
                "engine_unavailable",
                f"the stream's engine was lost and no replica could take it over within "
                f"{timeout_s:g} s",
                ENGINE_RETRY_AFTER_S,
            ) from None
        finally:
            if entry in self._resuming:
                self._resuming.remove(entry)
            future.cancel()
        assert ticket.replica is not None
        return ticket.replica

    def max_streams(self) -> int:
        """Streams the placeable replicas hold now, together, within the operator's cap
        (``admission.max_streams``)."""
        measured = sum(self.replicas[i].max_streams() for i in self.placeable)
        cap = self.config.max_streams
        return measured if cap is None else min(measured, cap)

    # -- capacity changes -----------------------------------------------------------------------

    def on_engine_stats(self, message: Stats, replica: int = 0) -> None:
        """Fold a replica's engine report into its capacity model, then admit whoever now
        fits."""
        capacity = self.replicas.get(replica)
        if capacity is not None:
            capacity.observe(message)
        self._dispatch()

    def on_probe(self, report: StepReport, replica: int) -> bool:
        """Fold a replica's probe into its capacity model, then admit whoever now fits;
        ``False`` when the probe said nothing (too little decoding)."""
        capacity = self.replicas.get(replica)
        counted = capacity is not None and capacity.observe_probe(report)
        self._dispatch()
        return counted

    def snapshot(self) -> CapacitySnapshot:
        """What ``GET /v1/capacity`` says (:func:`~.capacity_report.snapshot_of`)."""
        return snapshot_of(self)

    def claim_evidence(self) -> ClaimEvidence:
        """The claim at the factor in use, the windows' evidence and the serving floor."""
        return claim_evidence_of(self)

    @property
    def num_resuming(self) -> int:
        """Admitted streams waiting for a replica after theirs was lost."""
        return len(self._resuming)

    def load_on(self, replica: int) -> AdmittedLoad:
        """The streams admitted to ``replica`` as admission weighs one more."""
        return admitted_load(
            ((t.cost, t.admitted_at) for t in self.active if t.replica == replica),
            self.clock(),
            self.capacity.plan.step_period_s,
        )

    # -- internals ------------------------------------------------------------------------------

    def _placement(self, cost: StreamCost, prefix: str | None = None) -> Placement:
        """The replica a stream of ``cost`` should start on (:func:`~.placement.place`); none
        (``operator_cap``) while the operator's cap is reached."""
        cap = self.config.max_streams
        if cap is not None and len(self.active) >= cap:
            return Placement(None, "operator_cap")
        return place(
            self.replicas,
            self.placeable,
            self.load_on,
            cost,
            lambda index: prefix is not None and prefix in self._prefixes.get(index, {}),
        )

    def _may_overtake_queue(self) -> bool:
        """Whether a stream that fits now may start ahead of the waiters: when none waits, or
        every waiter is held only by a short hold (prompts being prefilled, a wave of
        arrivals aging: a stream that fits now takes nothing they wait for; prompts go by
        deadline in the engine)."""
        return all(waiter.held_by in SHORT_HOLDS for waiter in self.queues)

    def _admit(
        self,
        priority: Priority,
        cost: StreamCost,
        enqueued_at: float | None,
        replica: int,
        prefix: str | None,
    ) -> Ticket:
        """A ticket for a stream admitted to ``replica`` (``enqueued_at``: when it started
        waiting, if it did)."""
        now = self.clock()
        waited = 0.0 if enqueued_at is None else now - enqueued_at
        rate = 1.0 - self.capacity.plan.headroom
        ticket = Ticket(priority, cost, now, waited, now + cost.audio_s * rate, replica)
        self.active.add(ticket)
        if prefix is not None:
            recent = self._prefixes.setdefault(replica, OrderedDict())
            recent[prefix] = None
            recent.move_to_end(prefix)
            while len(recent) > _PREFIXES_KEPT:
                recent.popitem(last=False)
        self.update_gauges()
        return ticket

    def _dispatch(self) -> None:
        """Place streams to resume, then admit waiters in queue order, while the next fits."""
        while self._resuming:
            ticket, future = self._resuming[0]
            replica = None if future.done() else self._placement(ticket.cost).replica
            if not future.done() and replica is None:
                break
            self._resuming.popleft()
            if not future.done():
                ticket.replica = replica
                future.set_result(None)
        while not self._resuming:
            now = self.clock()
            active: Counter[str] = Counter(t.priority for t in self.active)
            waiter = self.queues.peek(now, active, self.max_streams())
            if waiter is None:
                break
            placement = self._placement(waiter.cost, waiter.prefix)
            waiter.held_by = placement.reason
            if placement.replica is None and placement.reason in SHORT_HOLDS:
                # Held by a short hold alone: a waiter behind it that fits may go first; and
                # as nothing else may happen by the time it clears (no stream ends, no
                # report), look again then.
                self._recheck_after(placement.hold_wait_s)
                waiter, placement = self._first_fitting_waiter()
            if waiter is None or placement.replica is None:
                break
            self.queues.remove(waiter)
            ticket = self._admit(
                waiter.priority, waiter.cost, waiter.enqueued_at, placement.replica, waiter.prefix
            )
            self._granted[waiter] = ticket
            waiter.admitted.set_result(None)
            self._count(waiter.priority, "admitted", "after_wait")
        self.update_gauges()

    def _recheck_after(self, wait_s: float) -> None:
        """Dispatch again in ``wait_s`` (once: a later call moves the one pending)."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # waiters exist only on the loop; none is running here
        if self._recheck is not None:
            self._recheck.cancel()
        delay_s = min(wait_s, self._max_wait["batch"]) + _PREFILL_RECHECK_S
        self._recheck = loop.call_later(delay_s, self._dispatch)

    def _first_fitting_waiter(self) -> tuple[Waiter | None, Placement]:
        """The first waiter (in queue order) that fits now, while those before it are held
        only by prompts; ``(None, ...)`` when none does."""
        for waiter in self.queues:
            placement = self._placement(waiter.cost, waiter.prefix)
            if placement.replica is not None:
                return waiter, placement
            waiter.held_by = placement.reason
            if placement.reason not in SHORT_HOLDS:
                break
        return None, Placement(None)

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
        self.metrics.max_streams.set(self.max_streams())
        is_open = any(self.replicas[i].admission_open for i in self.placeable)
        self.metrics.admission_open.set(1 if is_open else 0)
        factors = [self.replicas[i].realtime_factor() for i in self.placeable]
        self.metrics.realtime_factor.set(max(factors, default=self.capacity.realtime_factor()))
