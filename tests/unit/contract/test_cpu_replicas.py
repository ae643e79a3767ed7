"""How replicas divide a CPU: their own cores when each gets one or more, else all share."""

from cadenza.contract.cpu_replicas import core_sharers, cores_per_replica, usable_cores


def test_replicas_split_the_cores_or_share_them() -> None:
    assert (cores_per_replica(1, 16), core_sharers(1, 16)) == (0, 1)  # one: every core
    assert (cores_per_replica(4, 16), core_sharers(4, 16)) == (4, 1)
    assert (cores_per_replica(3, 8), core_sharers(3, 8)) == (2, 1)
    assert (cores_per_replica(2, 2), core_sharers(2, 2)) == (1, 1)  # one core each
    assert (cores_per_replica(3, 5), core_sharers(3, 5)) == (1, 1)
    assert (cores_per_replica(3, 2), core_sharers(3, 2)) == (0, 3)  # more replicas than cores
    assert usable_cores() and all(core >= 0 for core in usable_cores())
