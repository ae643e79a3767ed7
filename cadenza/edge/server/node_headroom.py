"""The node's free real-time headroom in streams: what its HAProxy agent reports as a weight
(:mod:`~cadenza.edge.server.agent_check`) and what a WebSocket upgrade that asks to spill
checks before it is accepted (docs/scaling.md, "Spilling to another node"). Both read it from
the served models' capacity snapshots; neither models admission again."""

from __future__ import annotations

from collections.abc import Sequence

from cadenza.edge.admission.capacity_snapshot import CapacitySnapshot


def claimed_streams(snapshots: Sequence[CapacitySnapshot]) -> int:
    """Nominal streams the node claims over every served model (each within
    ``admission.max_streams``)."""
    return sum(s.max_streams for s in snapshots)


def free_streams(snapshots: Sequence[CapacitySnapshot]) -> int:
    """Nominal streams the node would still admit now: each model whose admission is open,
    its claim less its active and queued streams (never below 0), summed."""
    return sum(max(s.max_streams - s.active - s.queued, 0) for s in snapshots if s.admission_open)
