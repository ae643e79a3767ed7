"""The admission gate: immediate admission, priority queues with aging and reserved shares,
bounded waits with Retry-After, and no leaked slots when clients leave."""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace

import pytest

from cadenza.config import AdmissionConfig
from cadenza.contract.arrival_wave import WavePoint
from cadenza.edge.admission.capacity import CapacityModel, StreamCost
from cadenza.edge.admission.gate import AdmissionGate
from cadenza.edge.admission.priority_queues import PriorityQueues, Waiter
from cadenza.edge.admission.ticket import AdmissionRefused
from cadenza.edge.server.metrics import Metrics
from cadenza.edge.server.model_metrics import ModelMetrics
from tests.support.contract_examples import engine_info as info

COST = StreamCost(10, 4.0)


def gate(
    max_streams: int = 2,
    metrics: Metrics | None = None,
    max_streams_cap: int | None = None,
    **admission: float,
) -> AdmissionGate:
    """A gate of ``max_streams`` (the engine's; ``max_streams_cap``: the operator's);
    realtime requests may wait 30 s unless told otherwise (the tests of queueing need waits
    longer than a stream)."""
    admission = {"realtime_max_wait_s": 30.0, "max_streams": max_streams_cap, **admission}
    config = AdmissionConfig(**admission)  # type: ignore[arg-type]
    capacity = CapacityModel(info(max_num_seqs=max_streams), config)
    return AdmissionGate(config, capacity, ModelMetrics(metrics or Metrics(), "cadenza-tiny"))


def test_admits_at_once_while_capacity_lasts_then_queues() -> None:
    async def scenario() -> None:
        g = gate(max_streams=2)
        first = await g.acquire("realtime", COST)
        second = await g.acquire("standard", COST)
        assert first.waited_s == 0 and len(g.active) == 2
        notices: list[tuple[int, float]] = []

        async def on_queued(position: int, wait_s: float) -> None:
            notices.append((position, wait_s))

        third = asyncio.create_task(g.acquire("realtime", COST, on_queued))
        await asyncio.sleep(0.01)
        assert not third.done() and g.snapshot().queued == 1
        assert notices and notices[0][0] == 1 and notices[0][1] >= 1.0
        g.release(first)
        ticket = await asyncio.wait_for(third, 1)
        assert ticket.waited_s > 0
        g.release(second)
        g.release(ticket)
        assert not g.active and g.snapshot().queued == 0

    asyncio.run(scenario())


def test_full_queue_and_long_wait_are_refused_with_retry_after() -> None:
    async def scenario() -> None:
        g = gate(max_streams=1, max_queue_length=1, realtime_max_wait_s=0.05)
        held = await g.acquire("realtime", StreamCost(10, 0.01))  # expected to end at once
        waiting = asyncio.create_task(g.acquire("realtime", COST))
        await asyncio.sleep(0.01)
        with pytest.raises(AdmissionRefused) as full:
            await g.acquire("realtime", COST)
        assert full.value.code == "queue_full" and full.value.retry_after_s >= 1.0
        with pytest.raises(AdmissionRefused) as timeout:
            await waiting
        assert timeout.value.code == "queue_timeout"
        assert timeout.value.retry_after_s >= 1
        g.release(held)
        assert not g.active and not g.queues

    asyncio.run(scenario())


def test_a_wait_expected_longer_than_the_class_allows_is_refused_at_once() -> None:
    """A realtime listener is not kept waiting for a slot that will not come in time: it is
    refused at once, with the expected wait as Retry-After; a standard request queues."""

    metrics = Metrics()

    async def scenario() -> None:
        g = gate(max_streams=1, metrics=metrics, realtime_max_wait_s=0.25)
        held = await g.acquire("realtime", COST)  # 4 s of audio: ends in about 3.6 s
        with pytest.raises(AdmissionRefused) as refused:
            await asyncio.wait_for(g.acquire("realtime", COST), 0.1)
        assert refused.value.code == "queue_timeout"
        assert "(realtime_budget)" in str(refused.value)
        assert 3.0 <= refused.value.retry_after_s <= 4.0
        standard = asyncio.create_task(g.acquire("standard", COST))
        await asyncio.sleep(0.01)
        assert not standard.done() and g.snapshot().queued == 1
        # What held each stream that could not start at once is counted by reason.
        labels = {"model": "cadenza-tiny", "reason": "realtime_budget"}
        assert metrics.registry.get_sample_value("cadenza_admission_holds_total", labels) == 2
        g.release(held)
        g.release(await asyncio.wait_for(standard, 1))
        assert not g.active and not g.queues

    asyncio.run(scenario())


def test_a_request_that_can_never_fit_is_refused_at_once() -> None:
    async def scenario() -> None:
        g = gate()
        with pytest.raises(AdmissionRefused) as refused:
            await g.acquire("batch", StreamCost(10**9, 1.0))
        assert refused.value.code == "too_large"

    asyncio.run(scenario())


def test_a_client_leaving_while_queued_leaks_nothing() -> None:
    async def scenario() -> None:
        g = gate(max_streams=1)
        held = await g.acquire("realtime", COST)
        waiting = asyncio.create_task(g.acquire("realtime", COST))
        await asyncio.sleep(0.01)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        assert not g.queues
        g.release(held)
        assert not g.active
        # Granted and cancelled in the same loop turn: either the slot comes back at once, or
        # the caller holds a ticket it must release (its next await raises the cancellation).
        held = await g.acquire("realtime", COST)
        waiting = asyncio.create_task(g.acquire("realtime", COST))
        await asyncio.sleep(0.01)
        g.release(held)
        waiting.cancel()
        outcome = await asyncio.gather(waiting, return_exceptions=True)
        if not isinstance(outcome[0], asyncio.CancelledError):
            g.release(outcome[0])
        assert not g.active and not g._granted

    asyncio.run(scenario())


def test_standard_is_not_starved_by_a_realtime_flood() -> None:
    """Every slot frees up with a realtime request and a standard one waiting: the standard
    request's reserved share and aging get it in well within its maximum wait."""

    async def scenario() -> None:
        g = gate(max_streams=5, standard_reserved_share=0.2, aging_s=10.0)
        tickets = [await g.acquire("realtime", COST) for _ in range(5)]
        standard = asyncio.create_task(g.acquire("standard", COST))
        flood = [asyncio.create_task(g.acquire("realtime", COST)) for _ in range(20)]
        await asyncio.sleep(0.01)
        g.release(tickets.pop(0))
        ticket = await asyncio.wait_for(standard, 1)  # the first free slot is its share
        assert ticket.priority == "standard"
        for task in flood:
            task.cancel()
        await asyncio.gather(*flood, return_exceptions=True)

    asyncio.run(scenario())


def test_aging_lifts_a_waiting_request_over_fresh_higher_classes() -> None:
    """Effective priority = class rank + seconds waited / aging_s: batch (0) overtakes a
    realtime request (2) that arrived more than 2 * aging_s after it."""

    async def scenario() -> None:
        queues = PriorityQueues(aging_s=10.0, reserved_share={})
        old_batch = Waiter("batch", COST, enqueued_at=0.0)
        queues.push(old_batch)
        recent = Waiter("realtime", COST, enqueued_at=15.0)
        queues.push(recent)
        assert queues.peek(16.0, {}, 10) is recent  # 1.6 < 2.1
        queues.remove(recent)
        fresh = Waiter("realtime", COST, enqueued_at=25.0)
        queues.push(fresh)
        assert queues.peek(25.5, {}, 10) is old_batch  # 2.55 > 2.05
        assert queues.position(old_batch, 25.5) == 1
        assert queues.position(fresh, 25.5) == 2

    asyncio.run(scenario())


def test_a_lost_engine_refuses_every_waiter_at_once() -> None:
    async def scenario() -> None:
        g = gate(max_streams=1, standard_max_wait_s=60.0)
        held = await g.acquire("realtime", COST)
        waiting = [asyncio.create_task(g.acquire("standard", COST)) for _ in range(3)]
        await asyncio.sleep(0.01)
        g.fail_waiting("engine unavailable: it exited")
        outcomes = await asyncio.wait_for(asyncio.gather(*waiting, return_exceptions=True), 1)
        assert all(isinstance(o, AdmissionRefused) for o in outcomes)
        assert {o.code for o in outcomes} == {"engine_unavailable"}
        assert not g.queues and g.active == {held}
        g.release(held)
        assert not g.active and not g._granted

    asyncio.run(scenario())


def test_the_realtime_factor_is_exported_as_it_changes() -> None:
    from tests.support.contract_examples import timed_stats

    metrics = Metrics()
    config = AdmissionConfig()
    capacity = CapacityModel(info(), config)
    g = AdmissionGate(config, capacity, ModelMetrics(metrics, "cadenza-tiny"))
    g.on_engine_stats(timed_stats(2.0))
    value = metrics.registry.get_sample_value(
        "cadenza_admission_realtime_factor", {"model": "cadenza-tiny"}
    )
    assert value == pytest.approx(2.0) and g.snapshot().realtime_factor == pytest.approx(2.0)


def two_replicas(max_streams: int = 2) -> AdmissionGate:
    g = gate(max_streams=max_streams)
    config = g.config
    g.set_replica(1, CapacityModel(info(max_num_seqs=max_streams), config))
    return g


def test_streams_are_placed_on_the_replica_with_the_most_headroom() -> None:
    async def scenario() -> None:
        g = two_replicas(max_streams=2)
        tickets = [await g.acquire("realtime", COST) for _ in range(4)]
        assert sorted(t.replica for t in tickets) == [0, 0, 1, 1]
        snapshot = g.snapshot()
        assert snapshot.max_streams == 4 and snapshot.active == 4
        assert [r.active for r in snapshot.replicas] == [2, 2]
        assert snapshot.available_now == 0
        # bounds add up over replicas on their own cores (13 streams of 1 ms fit 13.3 ms)
        assert snapshot.bounds is not None and snapshot.bounds.realtime_streams == 26
        for ticket in tickets:
            g.release(ticket)
        # equal headroom: the replica that served the prompt prefix lately wins
        first = await g.acquire("realtime", COST, prefix="voice-a")
        g.release(first)
        again = await g.acquire("realtime", COST, prefix="voice-a")
        assert again.replica == first.replica
        g.release(again)

    asyncio.run(scenario())


def test_a_lost_replica_s_streams_resume_before_any_waiter_and_draining_takes_none() -> None:
    async def scenario() -> None:
        g = two_replicas(max_streams=1)
        on_0 = await g.acquire("realtime", COST)
        on_1 = await g.acquire("realtime", COST)
        assert {on_0.replica, on_1.replica} == {0, 1}
        lost = on_0.replica
        assert g.replica_lost(lost) == [on_0] and on_0.replica is None
        assert g.snapshot().max_streams == 1
        waiter = asyncio.create_task(g.acquire("standard", COST))
        resumed = asyncio.create_task(g.relocate(on_0, timeout_s=5))
        await asyncio.sleep(0.01)
        assert not resumed.done() and not waiter.done()
        g.release(on_1)  # room on the live replica: the orphan goes first
        assert await asyncio.wait_for(resumed, 1) == on_1.replica
        assert not waiter.done()
        g.set_replica(lost, CapacityModel(info(max_num_seqs=1), g.config))
        ticket = await asyncio.wait_for(waiter, 1)
        assert ticket.replica == lost
        g.hold_replica(lost)  # draining: its stream runs on, nothing new goes there
        assert g.streams_on(lost) == 1 and lost not in g.placeable
        g.release(on_0)
        g.release(ticket)
        assert not g.active

    asyncio.run(scenario())


def test_a_stream_no_replica_can_take_in_time_is_refused() -> None:
    async def scenario() -> None:
        g = gate(max_streams=1)
        ticket = await g.acquire("realtime", COST)
        g.replica_lost(0)
        with pytest.raises(AdmissionRefused) as refused:
            await g.relocate(ticket, timeout_s=0.05)
        assert refused.value.code == "engine_unavailable"
        assert g.snapshot().resuming == 0 and g.snapshot().max_streams == 0
        g.release(ticket)

    asyncio.run(scenario())


def test_a_prompt_holds_prefill_time_until_its_rows_are_expected_done() -> None:
    """Prompts admitted back to back queue for prefill: a third nominal prompt does not fit
    beside two just admitted (1 ms a row in the example engine), and fits once their rows are
    expected done."""
    now = [100.0]
    config = AdmissionConfig(realtime_max_wait_s=30.0)
    capacity = CapacityModel(info(max_num_seqs=8), config, clock=lambda: now[0])
    g = AdmissionGate(config, capacity, ModelMetrics(Metrics(), "cadenza-tiny"), lambda: now[0])
    prompt = StreamCost(10, 4.0, prompt_tokens=66)

    async def scenario() -> None:
        await g.acquire("realtime", prompt)
        await g.acquire("realtime", prompt)

    asyncio.run(scenario())
    assert capacity.refusal(g.load_on(0), prompt) == "prefill_budget"
    late_s = capacity.prefill_lateness_s(g.load_on(0), prompt)
    assert 0 < late_s < 0.1
    now[0] += late_s + 0.001  # what waiting that long does: the prompts ahead progress
    assert capacity.refusal(g.load_on(0), prompt) is None


def test_a_stream_held_by_prompts_just_admitted_waits_for_their_prefill_not_a_stream_end() -> None:
    """A realtime stream whose prompt does not fit beside the prompts just admitted is not
    refused for the seconds until a stream ends: it waits the fraction of a second their
    prefill takes, then starts."""
    metrics = Metrics()

    async def scenario() -> None:
        g = gate(max_streams=8, metrics=metrics, realtime_max_wait_s=0.25)
        prompt = StreamCost(10, 4.0, prompt_tokens=66)  # 92 ms at the unmeasured CPU's 1.4
        first = await g.acquire("realtime", prompt)
        second = await g.acquire("realtime", prompt)
        started = time.monotonic()
        third = await asyncio.wait_for(g.acquire("realtime", prompt), 1.0)
        waited = time.monotonic() - started
        assert 0.01 < waited < 0.25 and third.waited_s > 0
        for ticket in (first, second, third):
            g.release(ticket)

    asyncio.run(scenario())
    queued = {"model": "cadenza-tiny", "priority": "realtime", "decision": "queued"}
    held = metrics.registry.get_sample_value(
        "cadenza_admission_decisions_total", {**queued, "reason": "prefill_budget"}
    )
    assert held == 1


def test_a_short_prompt_is_not_kept_waiting_behind_long_ones_held_by_their_prefill() -> None:
    """Long prompts waiting for the prompts ahead of them to be prefilled hold nothing a short
    prompt needs: one that fits now starts at once, ahead of them."""

    async def scenario() -> None:
        g = gate(max_streams=16, realtime_max_wait_s=2.0, unmeasured_factor=1.0)
        long = StreamCost(10, 4.0, prompt_tokens=200)  # 200 ms each in the example engine
        admitted = []
        while g.capacity.refusal(g.load_on(0), long) is None:
            admitted.append(await g.acquire("realtime", long))
        assert len(admitted) >= 4  # due later than a short prompt: several fit together
        waiting = asyncio.create_task(g.acquire("realtime", long))
        await asyncio.sleep(0.01)
        assert not waiting.done() and len(g.queues) == 1
        short = await asyncio.wait_for(g.acquire("realtime", StreamCost(10, 4.0, 20)), 0.05)
        assert short.waited_s == 0 and len(g.queues) == 1
        for ticket in [*admitted, short, await waiting]:
            g.release(ticket)
        assert not g.active and not g.queues

    asyncio.run(scenario())


def test_the_operators_cap_holds_below_the_measured_capacity() -> None:
    """``admission.max_streams`` caps what the gate admits and what it claims: a stream past
    the cap waits (held by ``operator_cap``) though the engine has room, and starts when one
    ends; /v1/capacity counts the cap."""

    async def scenario() -> None:
        g = gate(max_streams=4, max_streams_cap=2)
        first = await g.acquire("realtime", COST)
        await g.acquire("realtime", COST)
        snapshot = g.snapshot()
        assert (snapshot.max_streams, snapshot.available_now) == (2, 0)
        assert snapshot.limits.operator == 2 and snapshot.limits.max_num_seqs == 4
        third = asyncio.create_task(g.acquire("standard", COST))
        await asyncio.sleep(0.01)
        assert not third.done() and [w.held_by for w in g.queues] == ["operator_cap"]
        g.release(first)
        await asyncio.wait_for(third, 1)
        assert len(g.active) == 2

    asyncio.run(scenario())


def test_the_operators_cap_must_be_a_positive_count() -> None:
    for garbage in (0, -3, "many", 2.5):
        with pytest.raises(ValueError, match="max_streams"):
            AdmissionConfig(max_streams=garbage)  # type: ignore[arg-type]


def test_a_burst_past_the_measured_wave_waits_for_the_wave_to_age_then_starts() -> None:
    """Arrivals beyond the largest wave the calibration saw holding are not refused for a
    stream's length: they wait the fraction of a second until the streams they would start
    with are past their first chunks, then start."""
    metrics = Metrics()

    async def scenario() -> None:
        config = AdmissionConfig(realtime_max_wait_s=0.5, unmeasured_factor=1.0, wave_headroom=1.0)
        calibrated = info(max_num_seqs=16)
        assert calibrated.calibration is not None
        waves = (WavePoint(2, 3.0, 0.05), WavePoint(3, 0.9, 0.05))  # two at once, then 0.05 s
        engine = replace(calibrated, calibration=replace(calibrated.calibration, waves=waves))
        g = AdmissionGate(
            config, CapacityModel(engine, config), ModelMetrics(metrics, "cadenza-tiny")
        )
        cost = StreamCost(10, 4.0, prompt_tokens=4)
        burst = [g.acquire("realtime", cost) for _ in range(3)]
        started = time.monotonic()
        tickets = await asyncio.wait_for(asyncio.gather(*burst), 1.0)
        assert [t.waited_s == 0 for t in tickets].count(True) == 2
        assert 0.03 < time.monotonic() - started < 0.5
        for ticket in tickets:
            g.release(ticket)
        assert not g.active and not g.queues

    asyncio.run(scenario())
    queued = {"model": "cadenza-tiny", "priority": "realtime", "decision": "queued"}
    held = metrics.registry.get_sample_value(
        "cadenza_admission_decisions_total", {**queued, "reason": "arrival_wave"}
    )
    assert held == 1
