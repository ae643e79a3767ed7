"""How engine replicas of a model divide a CPU machine: the rule the engine process places
itself by and the edge's admission counts with, so both agree.

Every replica gets ``cores // replicas`` cores of its own (pinned, that many threads) when that
is at least :data:`MIN_CORES_PER_REPLICA`, i.e. when there are at least as many cores as
replicas; otherwise all replicas share every core, and a step of one may run ``replicas`` times
slower while the others are busy too.

Nodes on one host (several ``cadenza serve`` processes: two pods on one Kubernetes node, the
fleet tests) divide its cores first (:func:`node_share`, from the host's registry of live nodes,
:mod:`cadenza.contract.host_nodes`): each node runs, edge and engines, on its own block of
them, and its replicas divide that block as above; where there are more nodes than cores they
all share every core. A node's edge pins itself to its share before it starts its engines,
which inherit it: both sides then see the same cores (:func:`usable_cores`).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

# A replica may be pinned to a single core, one thread: on a 2-core CPU, cadenza-tiny's steps
# at 1-4 streams took about as long on one thread as on two (a small batch's step is mostly one
# thread's work: op dispatch, small products), so two single-core replicas held twice the
# streams of one on both cores (docs/journal/2026-12-02-replicas-on-their-own-cores.md).
MIN_CORES_PER_REPLICA = 1

# Where ``supervision.replicas`` is unset, a CPU-only machine with at most this many cores runs
# one replica per core; measured on 2 cores: twice the streams at SLO of one replica on both
# (docs/journal/2026-12-02-replicas-on-their-own-cores.md). Larger machines keep one replica
# until their split is measured (each replica loads its own weights and KV pool, and a large
# model's products need many cores).
AUTO_MAX_CORES = 2
_GPU_DEVICE_FILES = ("/dev/nvidiactl", "/dev/kfd")  # NVIDIA's driver; AMD's ROCm


def default_replicas(device: str, mode: str, kind: str = "cadenza") -> int:
    """``supervision.replicas`` when it is unset, for ``model.device``, ``supervision.mode`` and
    ``engine.kind``: one per core for the batching engine in its own processes on a CPU
    (``device = cpu``, or ``auto`` on a machine without a GPU driver) of at most
    :data:`AUTO_MAX_CORES` cores; one otherwise. Edge and engine process decide alike (the
    engine inherits the edge's cores), without importing torch."""
    if kind != "cadenza" or mode != "process" or device == "cuda":
        return 1
    if device == "auto" and any(Path(path).exists() for path in _GPU_DEVICE_FILES):
        return 1
    cores = len(usable_cores())
    return cores if 1 < cores <= AUTO_MAX_CORES else 1


def replica_count(replicas: int | None, device: str, mode: str, kind: str = "cadenza") -> int:
    """``supervision.replicas``, or :func:`default_replicas` where it is unset."""
    return replicas if replicas is not None else default_replicas(device, mode, kind)


def cores_per_replica(replicas: int, cores: int) -> int:
    """Cores each replica gets to itself; 0 when they share every core (or there is one)."""
    if replicas < 2:
        return 0
    share = cores // replicas
    return share if share >= MIN_CORES_PER_REPLICA else 0


def core_sharers(replicas: int, cores: int, nodes: int = 1) -> int:
    """How many replicas run on each core: ``replicas`` when they share, else 1; times
    ``nodes``, the nodes sharing these cores (:attr:`NodeShare.sharers`)."""
    mine = replicas if replicas > 1 and cores_per_replica(replicas, cores) == 0 else 1
    return mine * max(nodes, 1)


def usable_cores() -> list[int]:
    """The CPU cores this process may run on."""
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))


@dataclass(frozen=True)
class NodeShare:
    """The cores one node (a ``cadenza serve`` process and its engines) runs on, of those the
    host lets it use, and ``sharers``: how many nodes run on those cores (1: they are its
    own; more: every node on the host shares every core)."""

    cores: tuple[int, ...]
    sharers: int = 1


def node_share(cores: Sequence[int], rank: int, nodes: int) -> NodeShare:
    """How the ``nodes`` nodes live on one host divide its ``cores``: the node of ``rank``
    (0-based, in the order of their registration slots) gets a contiguous block of them, the
    remainder one more core each to the first nodes; where there are more nodes than cores,
    every node runs on every core and they share them (their engines' OpenMP threads then
    sleep instead of spinning when idle, as replicas sharing cores do). One node alone (or
    none registered: ``nodes`` < 2) has every core."""
    ordered = tuple(sorted(cores))
    if nodes < 2 or not ordered:
        return NodeShare(ordered)
    if len(ordered) < nodes:
        return NodeShare(ordered, sharers=nodes)
    rank = min(max(rank, 0), nodes - 1)
    each, extra = divmod(len(ordered), nodes)
    start = rank * each + min(rank, extra)
    return NodeShare(ordered[start : start + each + (1 if rank < extra else 0)])
