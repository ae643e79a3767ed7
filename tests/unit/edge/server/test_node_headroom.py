"""The node's free streams, as its agent and a spilling WebSocket upgrade read them: each open
model's claim less its active and queued streams; and the upgrade's check on them, which
reserves a free stream per session accepted and refuses (503 ``at_capacity``) only a client
that asked to spill."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from cadenza.config import CadenzaConfig
from cadenza.edge.admission.capacity_snapshot import CapacitySnapshot
from cadenza.edge.server.metrics import Metrics
from cadenza.edge.server.node_headroom import claimed_streams, free_streams
from cadenza.edge.server.state import EdgeState
from cadenza.edge.streams.errors import EdgeError
from tests.unit.edge.server.test_agent_check import snapshot


def test_free_streams_are_each_open_models_claim_less_its_streams() -> None:
    assert free_streams([snapshot(4)]) == 4
    assert free_streams([snapshot(4, active=1, queued=1)]) == 2
    assert free_streams([snapshot(4, active=3, queued=5)]) == 0  # never below 0
    assert free_streams([snapshot(4, active=1), snapshot(2)]) == 5
    assert free_streams([snapshot(4), snapshot(4, open_=False)]) == 4  # a closed model: none
    assert claimed_streams([snapshot(4), snapshot(4, open_=False)]) == 8
    assert free_streams([]) == claimed_streams([]) == 0


def node(*snapshots: CapacitySnapshot, fleet: bool = True) -> EdgeState:
    """A node serving one model per snapshot (a stand-in service that reports it), one of a
    fleet (it answers the agent check) unless ``fleet`` is off."""
    services: dict[str, Any] = {
        f"model-{i}": SimpleNamespace(snapshot=lambda s=s: s) for i, s in enumerate(snapshots)
    }
    config = CadenzaConfig.model_validate({"server": {"agent_port": 0 if fleet else None}})
    return EdgeState(config=config, services=services, metrics=Metrics())


def test_a_node_alone_neither_reserves_nor_refuses() -> None:
    """A node outside a fleet has nowhere to spill to: a spilling client is accepted and
    queues as any other, and nothing is reserved."""
    state = node(snapshot(0), fleet=False)
    assert not state.spills
    assert state.reserve_session(spill=True) is None
    assert state.reservations.pending == 0


def test_the_upgrade_reserves_what_is_free_then_refuses_only_a_spilling_client() -> None:
    """Two free streams: two sessions of a burst reserve them; a third that asks to spill is
    refused with 503 ``at_capacity`` and Retry-After, one that does not is accepted without a
    reservation; a released reservation makes room again."""
    state = node(snapshot(4, active=2))
    first, second = state.reserve_session(spill=True), state.reserve_session(spill=False)
    assert first is not None and second is not None
    with pytest.raises(EdgeError) as refused:
        state.reserve_session(spill=True)
    assert refused.value.status == 503 and refused.value.code == "at_capacity"
    assert refused.value.headers["Retry-After"] == "1"
    refusals = state.metrics.stream_refusals.labels(transport="websocket", code="at_capacity")
    assert refusals._value.get() == 1  # the operator sees how often sessions went elsewhere
    assert state.reserve_session(spill=False) is None
    state.reservations.release(first)
    assert state.reserve_session(spill=True) is not None


def test_several_models_count_together() -> None:
    """A session names its model only in its ``speak``: the node's free streams are the sum."""
    state = node(snapshot(1, active=1), snapshot(2, active=1))
    assert state.reserve_session(spill=True) is not None
    with pytest.raises(EdgeError):
        state.reserve_session(spill=True)
