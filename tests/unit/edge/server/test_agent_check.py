"""The HAProxy agent check: the documented mapping from the node's state to its line, and the
agent's answer to any input (a clear note, never a dropped connection)."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from cadenza.config import AdmissionConfig
from cadenza.edge.admission.capacity import CapacityModel
from cadenza.edge.admission.gate import AdmissionGate
from cadenza.edge.server.agent_check import (
    AgentCheckServer,
    NodeState,
    agent_reply,
    free_percent,
)
from cadenza.edge.server.metrics import Metrics
from cadenza.edge.server.model_metrics import ModelMetrics
from tests.support.contract_examples import engine_info


def snapshot(max_streams: int, active: int = 0, queued: int = 0, open_: bool = True):
    config = AdmissionConfig(unmeasured_factor=1.0)
    gate = AdmissionGate(
        config,
        CapacityModel(engine_info(max_num_seqs=8), config),
        ModelMetrics(Metrics(), "cadenza-tiny"),
    )
    return dataclasses.replace(
        gate.snapshot(),
        max_streams=max_streams,
        active=active,
        queued=queued,
        admission_open=open_,
    )


def test_free_headroom_in_percent_of_the_claim_over_every_model() -> None:
    assert free_percent([snapshot(8)]) == 100
    assert free_percent([snapshot(8, active=3)]) == 62  # 5 of 8, rounded down
    assert free_percent([snapshot(8, active=6, queued=4)]) == 0  # queued count, never below 0
    assert free_percent([snapshot(8, active=8), snapshot(2)]) == 20
    assert free_percent([]) == 0


@pytest.mark.parametrize(
    ("node", "line"),
    [
        (NodeState(draining=False, ready=False, snapshots=()), "down"),
        (NodeState(draining=True, ready=False, snapshots=()), "down"),
        (NodeState(draining=True, ready=True, snapshots=[snapshot(8)]), "drain"),
        (NodeState(draining=False, ready=True, snapshots=[snapshot(8, open_=False)]), "drain"),
        (NodeState(draining=False, ready=True, snapshots=[snapshot(8, active=2)]), "up ready 75%"),
        (NodeState(draining=False, ready=True, snapshots=[snapshot(8, active=8)]), "up ready 1%"),
    ],
)
def test_the_documented_mapping(node: NodeState, line: str) -> None:
    """Not ready: down; draining or admission closed everywhere: drain; else up with the free
    headroom, at least 1% so that a full fleet still answers with cadenza's own 503."""
    assert agent_reply(node) == line


def test_streams_reserved_for_new_sessions_lower_the_weight() -> None:
    """WebSocket sessions accepted but not yet speaking count as taken: 1 of a claim of 4
    reserved next to 1 active leaves 50%; more reserved than free leaves the floor of 1%."""
    node = NodeState(False, True, snapshots=[snapshot(4, active=1)], reserved=1)
    assert agent_reply(node) == "up ready 50%"
    assert free_percent([snapshot(4, active=1)], reserved=1) == 50
    full = NodeState(False, True, snapshots=[snapshot(4, active=1)], reserved=5)
    assert agent_reply(full) == "up ready 1%"


def test_a_model_whose_admission_is_closed_has_no_free_streams() -> None:
    """It admits nothing: its claim still counts, its free streams do not."""
    assert free_percent([snapshot(4), snapshot(4, open_=False)]) == 50


def test_the_operators_cap_lowers_the_weight() -> None:
    """A capped node's claim is its cap (the gate reports it so): 2 of a cap of 4 is 50%."""
    node = NodeState(draining=False, ready=True, snapshots=[snapshot(4, active=2)])
    assert agent_reply(node) == "up ready 50%"


async def _ask(port: int, send: bytes | None) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    if send is not None:
        writer.write(send)
        await writer.drain()
    line = await asyncio.wait_for(reader.read(), 5)
    writer.close()
    return line


def test_the_agent_answers_a_line_per_connection_and_notes_any_input(caplog) -> None:
    async def scenario() -> list[bytes]:
        node = NodeState(draining=False, ready=True, snapshots=[snapshot(8, active=4)])
        agent = AgentCheckServer("127.0.0.1", 0, lambda: node)
        await agent.start()
        try:
            quiet = await _ask(agent.port, None)
            garbage = await _ask(agent.port, b"\x00\xffGET / HTTP/1.1\r\n" + b"x" * 4096)
            again = await _ask(agent.port, b"")
        finally:
            await agent.stop()
        return [quiet, garbage, again]

    quiet, garbage, again = asyncio.run(scenario())
    assert quiet == again == b"up ready 50%\n"
    assert garbage.startswith(b"up ready 50% # ignored input ") and garbage.endswith(b"\n")
    assert b"the agent takes no query" in garbage
    assert "agent check: ignored input" in caplog.text


def test_an_agent_port_in_use_is_named() -> None:
    async def scenario() -> None:
        first = AgentCheckServer("127.0.0.1", 0, lambda: NodeState(False, False, ()))
        await first.start()
        try:
            second = AgentCheckServer("127.0.0.1", first.port, lambda: NodeState(False, False, ()))
            with pytest.raises(OSError, match=f"agent port 127.0.0.1:{first.port}"):
                await second.start()
        finally:
            await first.stop()

    asyncio.run(scenario())
