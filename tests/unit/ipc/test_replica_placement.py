"""An engine replica is placed on its share of the machine before torch is imported."""

from __future__ import annotations

from cadenza.config import load_config
from cadenza.contract import cpu_replicas
from cadenza.ipc.engine_side import replica_placement


def test_a_placed_replica_knows_how_many_replicas_share_the_machine(monkeypatch) -> None:
    """The engine process is pinned to its share of the cores; the count it calibrates beside
    is the one decided before that, named in the configuration it runs with."""
    pinned: list[set[int]] = []
    monkeypatch.setattr(replica_placement, "usable_cores", lambda: [0, 1])
    monkeypatch.setattr(cpu_replicas, "usable_cores", lambda: [0, 1])
    monkeypatch.setattr(
        replica_placement.os, "sched_setaffinity", lambda _pid, cores: pinned.append(set(cores))
    )
    config = load_config(overrides={"model": {"device": "cpu"}, "supervision": {"replicas": None}})
    placed = replica_placement.place_replica(config, 1)
    assert placed.supervision.replicas == 2
    assert pinned == [{1}]
    assert placed.model.torch_threads == 1
