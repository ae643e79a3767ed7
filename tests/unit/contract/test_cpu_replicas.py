"""How replicas divide a CPU: their own cores when each gets one or more, else all share."""

import pytest

from cadenza.contract import cpu_replicas
from cadenza.contract.cpu_replicas import (
    NodeShare,
    core_sharers,
    cores_per_replica,
    default_replicas,
    node_share,
    replica_count,
    usable_cores,
)


def test_replicas_split_the_cores_or_share_them() -> None:
    assert (cores_per_replica(1, 16), core_sharers(1, 16)) == (0, 1)  # one: every core
    assert (cores_per_replica(4, 16), core_sharers(4, 16)) == (4, 1)
    assert (cores_per_replica(3, 8), core_sharers(3, 8)) == (2, 1)
    assert (cores_per_replica(2, 2), core_sharers(2, 2)) == (1, 1)  # one core each
    assert (cores_per_replica(3, 5), core_sharers(3, 5)) == (1, 1)
    assert (cores_per_replica(3, 2), core_sharers(3, 2)) == (0, 3)  # more replicas than cores
    assert usable_cores() and all(core >= 0 for core in usable_cores())


@pytest.mark.parametrize(("cores", "expected"), [(1, 1), (2, 2), (3, 1), (16, 1)])
def test_unset_replicas_mean_one_per_core_on_a_small_cpu(monkeypatch, cores, expected) -> None:
    monkeypatch.setattr(cpu_replicas, "usable_cores", lambda: list(range(cores)))
    monkeypatch.setattr(cpu_replicas, "_GPU_DEVICE_FILES", ())
    assert default_replicas("cpu", "process") == expected
    assert default_replicas("auto", "process") == expected  # no GPU driver: a CPU
    assert replica_count(None, "cpu", "process") == expected
    assert replica_count(3, "cpu", "process") == 3  # set: as set


def test_unset_replicas_mean_one_elsewhere(monkeypatch, tmp_path) -> None:
    monkeypatch.setattr(cpu_replicas, "usable_cores", lambda: [0, 1])
    assert default_replicas("cuda", "process") == 1
    assert default_replicas("cpu", "inprocess") == 1  # engine threads in the edge (tests)
    assert default_replicas("cpu", "process", kind="naive") == 1  # the baseline as it was
    driver = tmp_path / "nvidiactl"
    driver.touch()
    monkeypatch.setattr(cpu_replicas, "_GPU_DEVICE_FILES", (str(driver),))
    assert default_replicas("auto", "process") == 1  # a GPU machine: its devices decide
    assert default_replicas("cpu", "process") == 2  # unless told to run on the CPU


def test_nodes_on_one_host_divide_its_cores_in_blocks() -> None:
    cores = [0, 1, 2, 3, 4, 5, 6, 7]
    assert node_share(cores, 0, 1) == NodeShare(tuple(cores))  # alone: every core
    assert node_share(cores, 0, 0) == NodeShare(tuple(cores))  # not registered: the same
    halves = [node_share(cores, rank, 2).cores for rank in range(2)]
    assert halves == [(0, 1, 2, 3), (4, 5, 6, 7)]
    thirds = [node_share(cores, rank, 3) for rank in range(3)]
    assert [s.cores for s in thirds] == [(0, 1, 2), (3, 4, 5), (6, 7)]  # the first get more
    assert all(s.sharers == 1 for s in thirds)
    assert node_share([3, 1], 1, 2) == NodeShare((3,))  # in core order, whatever is given


def test_more_nodes_than_cores_share_every_core() -> None:
    """Two nodes on two cores: one core each; three: all three on both, counted as sharers
    (admission allows for them as for replicas sharing cores)."""
    assert [node_share([0, 1], rank, 2).cores for rank in range(2)] == [(0,), (1,)]
    crowded = node_share([0, 1], 2, 3)
    assert crowded == NodeShare((0, 1), sharers=3)
    assert core_sharers(1, 2, crowded.sharers) == 3
    assert core_sharers(3, 2, 2) == 6  # three replicas sharing, on cores two nodes share
    assert core_sharers(2, 2, 1) == 1  # a core each, the node's own
