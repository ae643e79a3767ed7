"""The registry of nodes on one host: slots held for a process's life, dead holders free."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from cadenza.contract import host_nodes
from cadenza.contract.cpu_replicas import NodeShare
from cadenza.contract.host_nodes import live_slots, register_node, sharing_slots


def test_nodes_take_the_lowest_free_slots_and_divide_the_cores(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(host_nodes, "usable_cores", lambda: [0, 1, 2, 3])
    first = register_node(tmp_path / "nodes")
    second = register_node(tmp_path / "nodes")
    try:
        assert (first.slot, second.slot) == (0, 1)
        assert live_slots(tmp_path / "nodes") == [0, 1]
        assert first.share() == NodeShare((0, 1))
        assert second.share() == NodeShare((2, 3))
        first.close()  # its slot is free again, and the other node has every core
        assert live_slots(tmp_path / "nodes") == [1]
        assert second.share() == NodeShare((0, 1, 2, 3))
        again = register_node(tmp_path / "nodes")
        assert again.slot == 0
        again.close()
    finally:
        first.close()
        second.close()


def test_a_dead_node_holds_no_slot(tmp_path: Path) -> None:
    """A node killed outright (no clean-up) leaves its file behind, but not its lock."""
    directory = tmp_path / "nodes"
    code = (
        "import sys, time; from pathlib import Path;"
        "from cadenza.contract.host_nodes import register_node;"
        f"node = register_node(Path({str(directory)!r})); print(node.slot, flush=True);"
        "time.sleep(60)"
    )
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "0"
        assert live_slots(directory) == [0]
        mine = register_node(directory)
        assert mine.slot == 1 and mine.share().sharers >= 1
    finally:
        child.kill()
        child.wait()
    deadline = time.monotonic() + 5
    while live_slots(directory) != [1] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert live_slots(directory) == [1]
    assert (directory / "node-0.lock").exists()  # left behind, and free
    mine.close()


def test_taking_the_share_pins_every_thread(tmp_path, monkeypatch) -> None:
    pinned: list[tuple[int, tuple[int, ...]]] = []
    monkeypatch.setattr(host_nodes, "usable_cores", lambda: [0, 1])
    monkeypatch.setattr(
        os, "sched_setaffinity", lambda tid, cores: pinned.append((tid, tuple(cores)))
    )
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    nodes = [register_node(tmp_path) for _ in range(3)]  # more nodes than cores
    try:
        threads = {int(t.name) for t in Path("/proc/self/task").iterdir()}
        share = nodes[0].take_share()
        assert share == NodeShare((0, 1), sharers=3)
        assert {tid for tid, _ in pinned} == threads  # every thread, not only the caller
        assert all(cores == (0, 1) for _, cores in pinned)
        assert os.environ["OMP_WAIT_POLICY"] == "PASSIVE"  # sharing: no spinning
    finally:
        for node in nodes:
            node.close()


def test_only_nodes_on_the_same_cores_divide_them() -> None:
    """Nodes kept apart already (taskset, a container's cpuset) leave each other alone; one
    whose cores are not known yet counts."""
    apart = {0: (0,), 1: (1,)}
    assert sharing_slots(0, (0,), apart) == [0]
    assert sharing_slots(1, (1,), apart) == [1]
    assert sharing_slots(1, (0, 1), {0: (0, 1), 1: (0, 1), 2: (2, 3)}) == [0, 1]
    assert sharing_slots(2, (0, 1), {0: None, 2: (0, 1)}) == [0, 2]


def test_nodes_pinned_apart_each_keep_their_cores(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(host_nodes, "usable_cores", lambda: [0])
    first = register_node(tmp_path)
    monkeypatch.setattr(host_nodes, "usable_cores", lambda: [1])
    second = register_node(tmp_path)
    try:
        assert first.share() == NodeShare((0,)) and second.share() == NodeShare((1,))
    finally:
        first.close()
        second.close()
