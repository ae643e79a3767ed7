"""What ``GET /v1/capacity`` says of a gate: its replicas' claims, limits and bounds added up,
the first replica's step numbers, and a line per replica (:class:`CapacitySnapshot`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from cadenza.edge.admission.capacity_snapshot import (
    CapacityLimits,
    CapacitySnapshot,
    ClaimEvidence,
    MachineBounds,
    QueueState,
    ReplicaCapacity,
)
from cadenza.edge.admission.priority_queues import PRIORITIES

if TYPE_CHECKING:
    from cadenza.edge.admission.gate import AdmissionGate


def snapshot_of(gate: AdmissionGate) -> CapacitySnapshot:
    """The gate's capacity now: the placeable replicas' totals, the first one's step
    numbers, and a line per replica."""
    now = gate.clock()
    placeable = sorted(gate.placeable)
    capacities = [gate.replicas[i] for i in placeable]
    first = capacities[0] if capacities else gate.capacity
    first_active = gate.streams_on(placeable[0]) if placeable else len(gate.active)
    lines = tuple(replica_line(gate, i) for i in sorted(gate.replicas))
    placed = [line for line in lines if line.placeable]
    available = sum(
        min(line.max_streams - line.active, line.prefill_burst)
        for line in placed
        if line.admission_open
    )
    cap = gate.config.max_streams
    if cap is not None:
        available = min(available, cap - len(gate.active))
    queues = gate.queues
    return CapacitySnapshot(
        max_streams=gate.max_streams(),
        available_now=max(available, 0) if not queues else 0,
        active=len(gate.active),
        queued=len(queues),
        resuming=gate.num_resuming,
        kv_pages_total=sum(c.info.kv_pages_total for c in capacities),
        kv_pages_free=sum(c.kv_pages_free for c in capacities),
        step_ms_p50=round(first.step_ms_p50(first_active), 3),
        rtf_headroom=round(first.rtf_headroom(first_active), 4),
        admission_open=any(line.admission_open for line in placed),
        queues={
            p: QueueState(queues.depth(p), round(queues.oldest_age_s(p, now), 3))
            for p in PRIORITIES
        },
        limits=CapacityLimits(
            realtime=sum(c.realtime_limit() for c in capacities),
            kv_memory=sum(c.kv_limit() for c in capacities),
            max_num_seqs=sum(c.info.max_num_seqs for c in capacities),
            prefill_burst=sum(line.prefill_burst for line in placed),
            operator=cap,
            arrival_wave=_wave_total([c.wave_limit() for c in capacities]),
        ),
        claim=claim_evidence_of(gate),
        bounds=machine_bounds([c.bounds() for c in capacities]),
        step_budget_ms=round(first.step_budget_ms, 3),
        step_correction=round(first.correction, 4),
        realtime_factor=round(first.realtime_factor(), 4),
        probes=sum(c.estimator.probes for c in capacities),
        calibration=first.info.calibration,
        replicas=lines,
    )


def _wave_total(limits: list[int | None]) -> int | None:
    """The replicas' arrival-wave limits added up (``None`` unless every one has one)."""
    if not limits or any(limit is None for limit in limits):
        return None
    return sum(limit for limit in limits if limit is not None)


def claim_evidence_of(gate: AdmissionGate) -> ClaimEvidence:
    """The claim at the factor in use, at the windows' evidence alone, and at the serving
    floor, summed over the placeable replicas."""
    capacities = [gate.replicas[i] for i in gate.placeable]
    return ClaimEvidence(
        held=sum(c.max_streams() for c in capacities),
        evidence=sum(c.max_streams(c.estimator.evidence()) for c in capacities),
        calibrated=sum(c.max_streams(c.estimator.serving_floor) for c in capacities),
    )


def replica_line(gate: AdmissionGate, index: int) -> ReplicaCapacity:
    """One replica's line of the snapshot."""
    capacity = gate.replicas[index]
    active = gate.streams_on(index)
    placeable = index in gate.placeable
    return ReplicaCapacity(
        replica=index,
        placeable=placeable,
        max_streams=capacity.max_streams() if placeable else 0,
        active=active,
        kv_pages_free=capacity.kv_pages_free,
        step_ms_p50=round(capacity.step_ms_p50(active), 3),
        realtime_factor=round(capacity.realtime_factor(), 4),
        admission_open=placeable and capacity.admission_open,
        prefill_burst=capacity.prefill_burst(gate.load_on(index)) if placeable else 0,
        probes=capacity.estimator.probes,
    )


def machine_bounds(shares: list[dict[str, float] | None]) -> MachineBounds | None:
    """The replicas' bounds added up (``None`` unless every one is calibrated): throughputs
    to two decimals, real-time bounds in whole streams."""
    if not shares or any(share is None for share in shares):
        return None
    total = {key: sum(share[key] for share in shares if share) for key in shares[0] or {}}
    return MachineBounds(
        throughput_streams=round(total["throughput_streams"], 2),
        long_context_throughput_streams=round(total["long_context_throughput_streams"], 2),
        realtime_streams=int(total["realtime_streams"] + 1e-9),
        realtime_short_context_streams=int(total["realtime_short_context_streams"] + 1e-9),
    )
