"""The cadenza nodes live on this host: a registry of lock files, one per node, so that nodes
started side by side divide the host's cores (:func:`~cadenza.contract.cpu_replicas.node_share`)
instead of running their engines' threads on each other's.

A node (the edge of a ``cadenza serve``) takes the lowest free slot ``node-<k>.lock`` in the
registry directory, holds an exclusive ``flock`` on it for its lifetime and writes into it its
process id and the cores it may use. The kernel drops the lock when the process ends, however
it ends: a dead node's file is a free slot, with nothing to clean up. Anyone finds the live
nodes by trying a shared lock on each file without waiting; it fails exactly where a live node
holds one (a count taken while a slot is being taken may miss that node, a node taking a slot
while one is counted may step to the next one: neither changes the count for long). Only
nodes whose cores overlap divide them (:func:`sharing_slots`): nodes already kept apart
(``taskset``, a container's cpuset) leave each other alone.

The registry is per user and per host (``supervision.host_registry_dir``; containers on one
host share it through a directory mounted from the host). Torch-free: the edge registers, and
its engines inherit the cores it pins itself to.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

from cadenza.contract.cpu_replicas import NodeShare, node_share, usable_cores

MAX_SLOTS = 1024
_PREFIX, _SUFFIX = "node-", ".lock"


def default_registry_dir() -> Path:
    """``$XDG_RUNTIME_DIR/cadenza/nodes`` where the session has a runtime directory, else
    ``<tmp>/cadenza-<uid>/nodes``."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and Path(runtime).is_dir():
        return Path(runtime) / "cadenza" / "nodes"
    return Path(tempfile.gettempdir()) / f"cadenza-{os.getuid()}" / "nodes"


def live_nodes(directory: Path) -> dict[int, tuple[int, ...] | None]:
    """The nodes alive now (their lock held), by slot: the cores each may use (``None``: not
    written yet, or unreadable)."""
    nodes: dict[int, tuple[int, ...] | None] = {}
    for path in directory.glob(f"{_PREFIX}*{_SUFFIX}"):
        slot = _slot_of(path)
        if slot is None:
            continue
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            continue  # gone meanwhile
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:  # a live node holds it
            nodes[slot] = _cores_in(os.read(fd, 4096))
        finally:
            os.close(fd)  # also drops the shared lock, if it was taken
    return dict(sorted(nodes.items()))


def live_slots(directory: Path) -> list[int]:
    """The slots whose node is alive now, in order."""
    return list(live_nodes(directory))


def sharing_slots(
    slot: int, cores: Sequence[int], nodes: Mapping[int, Sequence[int] | None]
) -> list[int]:
    """The slots, in order, of the live ``nodes`` that divide ``cores`` with the node in
    ``slot``: itself and every node that may use one of them (one whose cores are unknown
    counts)."""
    mine = set(cores)
    overlapping = {other for other, theirs in nodes.items() if theirs is None or mine & set(theirs)}
    return sorted({slot} | overlapping)


class HostNode:
    """This process's slot in the registry, held until :meth:`close` (or the process ends).
    ``cores``: the cores this process could use when it registered, which the live nodes
    divide."""

    def __init__(self, directory: Path, slot: int, fd: int, cores: tuple[int, ...]) -> None:
        self.directory = directory
        self.slot = slot
        self.cores = cores
        self._fd: int | None = fd

    def share(self) -> NodeShare:
        """This node's share of :attr:`cores` among the nodes live now that may use them."""
        sharing = sharing_slots(self.slot, self.cores, live_nodes(self.directory))
        return node_share(self.cores, sharing.index(self.slot), len(sharing))

    def take_share(self) -> NodeShare:
        """Read the registry now and run on this node's share from here on: every thread of
        this process pinned to its cores (the engine processes it starts later inherit
        them); where it shares every core with other nodes, OpenMP threads (in the engines,
        which inherit the environment) sleep instead of spinning when idle, as replicas
        sharing cores do. Call once the nodes started together have registered, before
        starting engines."""
        share = self.share()
        pin_process(share.cores)
        if share.sharers > 1:
            os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
        return share

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # releases the lock
            self._fd = None


def register_node(directory: Path) -> HostNode:
    """Take the lowest free slot in ``directory`` (created if missing). Raises ``OSError``
    when the directory cannot be used, ``RuntimeError`` when every slot is taken."""
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    cores = tuple(usable_cores())
    for slot in range(MAX_SLOTS):
        path = directory / f"{_PREFIX}{slot}{_SUFFIX}"
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        os.set_inheritable(fd, False)  # an engine process must not keep the node alive
        os.ftruncate(fd, 0)
        os.write(fd, json.dumps({"pid": os.getpid(), "cores": cores}).encode())
        return HostNode(directory, slot, fd, cores)
    raise RuntimeError(f"every one of {MAX_SLOTS} node slots in {directory} is taken")


def pin_process(cores: tuple[int, ...]) -> None:
    """Pin every thread of this process to ``cores`` (threads started later inherit it)."""
    if not cores or not hasattr(os, "sched_setaffinity"):
        return
    tasks = Path("/proc/self/task")
    threads = [int(t.name) for t in tasks.iterdir()] if tasks.is_dir() else [0]
    for thread in threads:
        with contextlib.suppress(ProcessLookupError):  # a thread that ended meanwhile
            os.sched_setaffinity(thread, cores)


def _cores_in(content: bytes) -> tuple[int, ...] | None:
    try:
        cores = json.loads(content)["cores"]
    except (ValueError, KeyError, TypeError):
        return None
    if not isinstance(cores, list) or not all(isinstance(c, int) for c in cores):
        return None
    return tuple(cores)


def _slot_of(path: Path) -> int | None:
    number = path.name[len(_PREFIX) : -len(_SUFFIX)]
    return int(number) if number.isdigit() else None
