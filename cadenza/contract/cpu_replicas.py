"""How engine replicas of a model divide a CPU machine: the rule the engine process places
itself by and the edge's admission counts with, so both agree.

Every replica gets ``cores // replicas`` cores of its own (pinned, that many threads) when that
is at least :data:`MIN_CORES_PER_REPLICA`, i.e. when there are at least as many cores as
replicas; otherwise all replicas share every core, and a step of one may run ``replicas`` times
slower while the others are busy too.
"""

from __future__ import annotations

import os

MIN_CORES_PER_REPLICA = 1  # a replica on one core runs its steps far slower than two share two


def cores_per_replica(replicas: int, cores: int) -> int:
    """Cores each replica gets to itself; 0 when they share every core (or there is one)."""
    if replicas < 2:
        return 0
    share = cores // replicas
    return share if share >= MIN_CORES_PER_REPLICA else 0


def core_sharers(replicas: int, cores: int) -> int:
    """How many replicas run on each core: ``replicas`` when they share, else 1."""
    return replicas if replicas > 1 and cores_per_replica(replicas, cores) == 0 else 1


def usable_cores() -> list[int]:
    """The CPU cores this process may run on."""
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))
