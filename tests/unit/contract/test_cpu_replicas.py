"""How replicas divide a CPU: their own cores when each gets one or more, else all share."""

import pytest

from cadenza.contract import cpu_replicas
from cadenza.contract.cpu_replicas import (
    core_sharers,
    cores_per_replica,
    default_replicas,
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
