"""Chaos during a load level: SIGKILL a random engine replica (or a whole node) every so often,
and time how long the server takes to have it back.

``--chaos-kill-every 20-30`` kills one ready replica (of any served model, picked at random)
every 20 to 30 seconds while the level offers streams. The replicas and their process ids come
from ``GET /admin/replicas`` (loopback, or the API key), so the server must run on the machine
the harness runs on. After each kill the harness polls until that replica is ready again under
a new process id: its *time to ready*. What the listeners went through is in the level's own
numbers; :func:`summarize_chaos` adds the share of admitted streams that completed and the
gaps they heard.

``--chaos-kill-nodes PID,-PGID,...`` kills whole nodes instead, for a run through a front door
to several nodes: each kill takes one node of the list still alive (a negative number is a
process group: the node's edge and engines at once, as a lost machine loses them). Nothing in
the harness restarts a node, so a node's kill has no time to ready; the listeners' side
(completed share, gaps, refusals) is the measurement.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import time
from dataclasses import dataclass
from typing import Any

import httpx

from cadenza.loadtest.level_summary import StreamResult, percentile
from cadenza.loadtest.workload import WorkloadError

_POLL_S = 0.1
_READY_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class ChaosSchedule:
    """Seconds between kills, uniform in ``[low_s, high_s]``; ``nodes``: whole nodes to kill
    instead of engine replicas (process ids, negative for a process group)."""

    low_s: float
    high_s: float
    nodes: tuple[int, ...] = ()

    @classmethod
    def parse(cls, spec: str, nodes: str | None = None) -> ChaosSchedule:
        """``A-B`` or ``A`` (seconds); ``nodes``: ``PID,-PGID,...`` (``--chaos-kill-nodes``)."""
        low, _, high = spec.partition("-")
        targets = parse_nodes(nodes)
        try:
            schedule = cls(float(low), float(high or low), targets)
        except ValueError:
            raise WorkloadError(f"--chaos-kill-every {spec!r}: expected A-B (seconds)") from None
        if not 0 < schedule.low_s <= schedule.high_s:
            raise WorkloadError(f"--chaos-kill-every {spec!r}: need 0 < A <= B")
        return schedule


def parse_nodes(spec: str | None) -> tuple[int, ...]:
    """``PID,-PGID,...`` as numbers; raises :class:`WorkloadError` naming the flag."""
    if spec is None:
        return ()
    nodes = []
    for part in spec.split(","):
        try:
            node = int(part.strip())
        except ValueError:
            node = 0
        if node in (0, 1, -1) or part.strip() != part.strip().lstrip("+"):
            raise WorkloadError(
                f"--chaos-kill-nodes {spec!r}: {part!r} is not a process id (PID) or a process "
                "group (-PGID)"
            )
        nodes.append(node)
    return tuple(nodes)


@dataclass
class Kill:
    at_s: float  # since the level started
    model: str  # "(node)" for a whole node
    replica: int  # a node's index in --chaos-kill-nodes
    pid: int  # negative: a process group
    ready_after_s: float | None = None  # None: not back within the harness's patience


async def run_chaos(
    http: httpx.AsyncClient,
    url: str,
    api_key: str | None,
    schedule: ChaosSchedule,
    rng: random.Random,
    start: float,
    stop_at: float,
) -> list[Kill]:
    """Kill replicas on ``schedule`` until ``stop_at`` (monotonic), then wait for the last
    ones to come back. Returns every kill."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    kills: list[Kill] = []
    returns: list[asyncio.Task[None]] = []
    try:
        while True:
            wait = rng.uniform(schedule.low_s, schedule.high_s)
            if time.monotonic() + wait >= stop_at:
                break
            await asyncio.sleep(wait)
            if schedule.nodes:
                node = _kill_a_node(schedule.nodes, kills, rng)
                if node is not None:
                    kills.append(Kill(time.monotonic() - start, "(node)", *node))
                continue
            victims = [r for r in await _replicas(http, url, headers) if r["status"] == "ready"]
            if not victims:
                continue
            victim = rng.choice(victims)
            with contextlib.suppress(ProcessLookupError):
                os.kill(victim["pid"], signal.SIGKILL)
            kill = Kill(time.monotonic() - start, victim["model"], victim["replica"], victim["pid"])
            kills.append(kill)
            returns.append(asyncio.create_task(_time_to_ready(http, url, headers, kill)))
        await asyncio.gather(*returns)
    finally:
        for task in returns:
            task.cancel()
    return kills


def _kill_a_node(
    nodes: tuple[int, ...], kills: list[Kill], rng: random.Random
) -> tuple[int, int] | None:
    """SIGKILL one node of ``nodes`` not killed yet (a process, or a process group); its
    index and number, or ``None`` when none is left."""
    killed = {kill.pid for kill in kills}
    left = [(index, node) for index, node in enumerate(nodes) if node not in killed]
    if not left:
        return None
    index, node = rng.choice(left)
    with contextlib.suppress(ProcessLookupError):
        if node < 0:
            os.killpg(-node, signal.SIGKILL)
        else:
            os.kill(node, signal.SIGKILL)
    return index, node


async def _replicas(
    http: httpx.AsyncClient, url: str, headers: dict[str, str]
) -> list[dict[str, Any]]:
    response = await http.get(f"{url}/admin/replicas", headers=headers)
    if response.status_code != 200:
        raise WorkloadError(
            f"{url}/admin/replicas answered {response.status_code}: chaos needs the admin "
            "routes (run the harness on the server's machine, or pass --api-key)"
        )
    return [
        {**replica, "model": model}
        for model, replicas in response.json()["models"].items()
        for replica in replicas
        if replica.get("pid")
    ]


async def _time_to_ready(
    http: httpx.AsyncClient, url: str, headers: dict[str, str], kill: Kill
) -> None:
    killed_at = time.monotonic()
    while time.monotonic() - killed_at < _READY_TIMEOUT_S:
        with contextlib.suppress(httpx.HTTPError):
            for replica in await _replicas(http, url, headers):
                if (
                    (replica["model"], replica["replica"]) == (kill.model, kill.replica)
                    and replica["status"] == "ready"
                    and replica["pid"] != kill.pid
                ):
                    kill.ready_after_s = time.monotonic() - killed_at
                    return
        await asyncio.sleep(_POLL_S)


def summarize_chaos(kills: list[Kill], results: list[StreamResult]) -> dict[str, Any]:
    """The level's ``chaos`` entry: the kills and each one's time to ready, the share of
    admitted streams that played to their end (a stream that broke after its audio started
    counts against it), and the gaps heard (every underrun of an admitted stream, in ms)."""
    admitted = [r for r in results if r.admitted]
    broken = [r for r in results if r.broken]
    gaps = [
        1000.0 * u.duration_s
        for r in admitted
        if r.playout is not None
        for u in r.playout.underruns
    ]
    ready = [k.ready_after_s for k in kills if k.ready_after_s is not None]
    started = len(admitted) + len(broken)
    return {
        "kills": len(kills),
        "kill_log": [
            {
                "at_s": round(k.at_s, 2),
                "model": k.model,
                "replica": k.replica,
                "ready_after_s": None if k.ready_after_s is None else round(k.ready_after_s, 2),
            }
            for k in kills
        ],
        "time_to_ready_s": {
            "p50": _round(percentile(ready, 50)),
            "max": _round(max(ready, default=None)),
            "not_back": len(kills) - len(ready),
        },
        "streams_started": started,
        "streams_completed": len(admitted),
        "completed_share": None if not started else round(len(admitted) / started, 5),
        "broken_by_reason": _count(r.reason or "unknown" for r in broken),
        "gaps_ms": {
            "count": len(gaps),
            "p50": _round(percentile(gaps, 50)),
            "p99": _round(percentile(gaps, 99)),
            "max": _round(max(gaps, default=None)),
        },
    }


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 2)


def _count(reasons: Any) -> dict[str, int]:
    counts: dict[str, int] = {}
    for reason in reasons:
        counts[reason] = counts.get(reason, 0) + 1
    return counts
