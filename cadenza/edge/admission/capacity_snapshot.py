"""What ``GET /v1/capacity`` says, typed: the admission gate builds a
:class:`CapacitySnapshot`, the model service adds each replica's status, the route serialises
it (:meth:`CapacitySnapshot.to_json`). docs/capacity.md explains every field."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import TypeAdapter

from cadenza.contract.calibration import Calibration


@dataclass(frozen=True)
class QueueState:
    depth: int
    oldest_wait_s: float


@dataclass(frozen=True)
class CapacityLimits:
    """The placeable replicas' limits, summed: nominal streams the real-time budget and the
    KV memory hold, the engines' ``max_num_seqs``, ``prefill_burst``: nominal streams that
    arriving together now would all start on time (their prompts prefilled by their
    deadlines, within the arrival-wave limit), ``operator``: the operator's cap
    (``admission.max_streams``; ``None``: unset), and ``arrival_wave``: the most streams
    that may start together at the realtime factor now, from the waves the calibration
    measured (``None``: none measured)."""

    realtime: int
    kv_memory: int
    max_num_seqs: int
    prefill_burst: int
    operator: int | None = None
    arrival_wave: int | None = None


@dataclass(frozen=True)
class ClaimEvidence:
    """The claim (nominal streams, summed over the placeable replicas) at three factors:
    ``held``, the realtime factor admission uses (``max_streams``); ``evidence``, what the
    windows alone say, without the hold and the climb (where the claim is heading);
    ``calibrated``, at the serving floor (what the claim can climb back to)."""

    held: int
    evidence: int
    calibrated: int


@dataclass(frozen=True)
class MachineBounds:
    """The engines' own ceilings, none of them admission's figure (docs/capacity.md)."""

    throughput_streams: float
    long_context_throughput_streams: float
    realtime_streams: int
    realtime_short_context_streams: int


@dataclass(frozen=True)
class ReplicaCapacity:
    replica: int
    placeable: bool
    max_streams: int
    active: int
    kv_pages_free: int
    step_ms_p50: float
    realtime_factor: float
    admission_open: bool
    prefill_burst: int
    probes: int
    status: str | None = None  # the model service's word for it (ready, restarting, ...)


@dataclass(frozen=True)
class CapacitySnapshot:
    """``max_streams``: nominal streams the placeable replicas hold now; ``available_now``:
    how many more nominal streams would be admitted at once if they arrived together now
    (the claim less the active, within the prefill burst, 0 while admission is closed);
    ``probes``: probe windows the replicas' factors have counted."""

    max_streams: int
    available_now: int
    active: int
    queued: int
    resuming: int
    kv_pages_total: int
    kv_pages_free: int
    step_ms_p50: float
    rtf_headroom: float
    admission_open: bool
    queues: dict[str, QueueState]
    limits: CapacityLimits
    claim: ClaimEvidence
    bounds: MachineBounds | None
    step_budget_ms: float
    step_correction: float
    realtime_factor: float
    probes: int
    calibration: Calibration | None
    replicas: tuple[ReplicaCapacity, ...]

    def to_json(self) -> dict[str, Any]:
        return _ADAPTER.dump_python(self, mode="json")


_ADAPTER: TypeAdapter[CapacitySnapshot] = TypeAdapter(CapacitySnapshot)
