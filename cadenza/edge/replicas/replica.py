"""One engine replica of a served model, supervised: started, watched, and started again.

A replica owns one engine process at a time (an :class:`EngineClient`). Its life::

    starting --ready--> ready --lost--> restarting --(backoff)--> ready ...
                          |                 `--(too many failures in a row)--> failed
                          `--hold--> draining --restart--> restarting --> ready

It is *lost* when its process exits, reports ``fatal``, or sends nothing for
``supervision.heartbeat_timeout_s`` (then it is killed); :class:`RestartPolicy` decides when the
next start is and when to give up. With ``supervision.warm_spare`` the replica keeps a second engine
loaded and idle: a lost engine is replaced by it at once (then a new spare loads in the
background), so its streams resume within the resume's prefill instead of a process start.

Every change is reported to the owner through the callbacks (the model service, which tells
admission, so that the replica's streams move elsewhere).
``on_lost`` runs the moment the engine client notices the loss, before any of the replica's
streams reads its failure: by then admission has taken their tickets off the replica, which is
what tells each stream to resume rather than fail.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Literal

from cadenza.config import CadenzaConfig
from cadenza.contract.engine_info import EngineInfo
from cadenza.contract.messages import Probed, Stats
from cadenza.edge.replicas.restart_policy import RestartPolicy
from cadenza.edge.server.model_metrics import ModelMetrics
from cadenza.ipc.edge_side.engine_client import EngineClient

log = logging.getLogger(__name__)

ReplicaStatus = Literal["starting", "ready", "draining", "restarting", "failed", "stopped"]
REPLICA_STATES: tuple[ReplicaStatus, ...] = (
    "starting",
    "ready",
    "draining",
    "restarting",
    "failed",
    "stopped",
)


class EngineReplica:
    """``on_stats(replica, message)``: each engine report; ``on_probe(replica, message)``:
    each probe its engine ran; ``on_ready(replica)``: it can take streams (first start and
    every restart); ``on_lost(replica, reason)``: its engine is gone and its streams with it
    (called once per loss, before any restart); ``on_recalibrated(replica)``: its engine
    measured its steps again and :attr:`info` has the new calibration."""

    def __init__(
        self,
        config: CadenzaConfig,
        index: int,
        metrics: ModelMetrics,
        *,
        on_stats: Callable[[EngineReplica, Stats], None],
        on_probe: Callable[[EngineReplica, Probed], None],
        on_ready: Callable[[EngineReplica], None],
        on_lost: Callable[[EngineReplica, str], None],
        on_recalibrated: Callable[[EngineReplica], None] | None = None,
    ) -> None:
        self.config = config
        self.index = index
        self.metrics = metrics
        self.on_stats = on_stats
        self.on_probe = on_probe
        self.on_ready = on_ready
        self.on_lost = on_lost
        self.on_recalibrated = on_recalibrated
        self.status: ReplicaStatus = "starting"
        self.client: EngineClient | None = None
        self.info: EngineInfo | None = None  # the last engine's (kept while it restarts)
        self.last_error: str | None = None
        self.policy = RestartPolicy(config.supervision)
        self.load_s = 0.0  # seconds the current engine took to start
        self._lost = asyncio.Event()
        self._supervisor: asyncio.Task[None] | None = None
        self._spare: EngineClient | None = None  # loaded, idle, takes over a lost engine
        self._spare_loading: asyncio.Task[None] | None = None
        self._closing: set[asyncio.Task[None]] = set()
        self._lock = asyncio.Lock()  # one start or stop at a time

    # -- what the owner asks ------------------------------------------------------------------

    @property
    def pid(self) -> int | None:
        """The engine process's id (``None``: no process, or an in-process engine)."""
        return None if self.client is None else self.client.engine_pid

    def is_ready(self) -> bool:
        return self.status == "ready" and self.client is not None and self.client.is_ready()

    @property
    def spare_status(self) -> str | None:
        """The warm spare's state: ``ready`` (it would take over a lost engine at once),
        ``loading``, or ``None`` (no spare)."""
        if self._spare is not None and self._spare.is_ready():
            return "ready"
        if self._spare is not None or (
            self._spare_loading is not None and not self._spare_loading.done()
        ):
            return "loading"
        return None

    async def start(self) -> None:
        """Start the first engine and supervise it from then on. Raises
        :class:`EngineUnavailable` when it does not come up (nothing is left running)."""
        async with self._lock:
            await self._start_engine()
        self._supervisor = asyncio.create_task(
            self._supervise(), name=f"cadenza-replica-{self.index}"
        )

    def hold(self) -> None:
        """Take no new streams (before a rolling restart); the running ones go on."""
        if self.status == "ready":
            self._set_status("draining")

    async def restart(self) -> bool:
        """Stop the engine (streams still on it are lost: the owner resumes them elsewhere)
        and start a new one; the restart counts, the loss does not count as a crash. Only a
        replica that is ready or draining restarts (one being restarted by its supervisor,
        failed or stopped is left alone). ``True`` when the new engine is ready."""
        async with self._lock:
            if self.status not in ("ready", "draining"):
                return self.is_ready()
            old = self.client
            self.client = None
            self._set_status("restarting")
            if old is not None:
                self.on_lost(self, "rolling restart")
                await old.close()
            started = time.monotonic()
            await self._drop_spare()  # a restart loads the files afresh, so no spare either
            try:
                await self._start_engine()
            except Exception as exc:  # EngineUnavailable, or the process could not start
                self.last_error = str(exc)
                self._lost.set()  # the supervisor takes it from here, with backoff
                return False
            self.metrics.engine_restarts.inc()
            self.metrics.engine_time_to_ready.observe(time.monotonic() - started)
            return True

    async def close(self) -> None:
        """Stop supervising and stop the engine."""
        if self._supervisor is not None:
            self._supervisor.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._supervisor
        async with self._lock:
            client, self.client = self.client, None
            self._set_status("stopped")
            await self._drop_spare()
            if client is not None:
                await client.close()
        if self._closing:
            await asyncio.gather(*self._closing, return_exceptions=True)

    # -- supervision --------------------------------------------------------------------------

    async def _start_engine(self) -> None:
        """One engine start (under the lock), or the warm spare taking over; ready on
        success. Raises EngineUnavailable."""
        if self.status != "restarting":
            self._set_status("starting")
        client = self._take_spare()
        if client is None:
            client = self._new_client()
            started = time.perf_counter()
            await client.start()
            self.load_s = time.perf_counter() - started
        self.client, self.info, self.last_error = client, client.info, None
        self._lost.clear()
        self.policy.on_ready(time.monotonic())
        self._set_status("ready")
        self.on_ready(self)
        self._load_spare()

    def _new_client(self) -> EngineClient:
        client = EngineClient(self.config, replica=self.index)
        client.on_stats = lambda message: self._stats(client, message)
        client.on_probe = lambda message: self._probed(client, message)
        client.on_failure = lambda reason: self._failed(client, reason)
        client.on_recalibrated = lambda info: self._recalibrated(client, info)
        client.on_output_delay = self.metrics.output_delay.observe
        return client

    def _take_spare(self) -> EngineClient | None:
        """The warm spare, if it is ready to take streams (it leaves the spare's place)."""
        spare, self._spare = self._spare, None
        if spare is not None and spare.is_ready():
            log.info("engine replica %d of %s: the warm spare takes over", self.index, self._name)
            return spare
        if spare is not None:
            self._close_later(spare)
        return None

    def _close_later(self, client: EngineClient) -> None:
        """Close ``client`` in the background (from a callback that cannot wait)."""
        task = asyncio.create_task(client.close())
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    def _load_spare(self) -> None:
        """Start loading a new warm spare in the background (with ``supervision.warm_spare``)."""
        loading = self._spare_loading is not None and not self._spare_loading.done()
        if not self.config.supervision.warm_spare or self._spare is not None or loading:
            return
        self._spare_loading = asyncio.create_task(
            self._prepare_spare(), name=f"cadenza-replica-{self.index}-spare"
        )

    async def _prepare_spare(self) -> None:
        client = self._new_client()
        try:
            await client.start()
        except Exception as exc:  # EngineUnavailable, or the process could not start
            log.warning("engine replica %d of %s: no warm spare: %s", self.index, self._name, exc)
            return
        if self.status in ("stopped", "failed"):
            await client.close()
            return
        self._spare = client

    async def _drop_spare(self) -> None:
        if self._spare_loading is not None:
            self._spare_loading.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._spare_loading
            self._spare_loading = None
        spare, self._spare = self._spare, None
        if spare is not None:
            await spare.close()

    def _stats(self, client: EngineClient, message: Stats) -> None:
        if client is self.client:
            self.on_stats(self, message)

    def _probed(self, client: EngineClient, message: Probed) -> None:
        if client is self.client:
            self.on_probe(self, message)

    def _recalibrated(self, client: EngineClient, info: EngineInfo) -> None:
        if client is self.client:
            self.info = info
            if self.on_recalibrated is not None:
                self.on_recalibrated(self)

    def _failed(self, client: EngineClient, reason: str) -> None:
        """The engine client lost its engine (called from its reader, or from its close,
        before it fails the streams); the supervisor restarts it."""
        if client is self._spare:
            self._spare = None  # the next start loads another
            log.warning(
                "engine replica %d of %s: warm spare lost: %s", self.index, self._name, reason
            )
            self._close_later(client)
            return
        if client is not self.client or self.status in ("restarting", "stopped"):
            return  # a deliberate stop, or an engine already replaced
        self.last_error = reason
        self.metrics.engine_crashes.inc()
        log.error("engine replica %d of %s lost: %s", self.index, self._name, reason)
        self._set_status("restarting")
        self.on_lost(self, reason)
        self._lost.set()

    async def _supervise(self) -> None:
        while True:
            await self._lost.wait()
            async with self._lock:
                self._lost.clear()
                if self.status == "stopped":
                    return
                if self.status == "ready":
                    continue  # a rolling restart replaced the lost engine meanwhile
                await self._recover(self.last_error or "engine lost")
            if self.status == "failed":
                return

    async def _recover(self, reason: str) -> None:
        """The engine is gone (and reported): stop what is left of it, then start a new one
        with backoff (or give up)."""
        lost_at = time.monotonic()
        old, self.client = self.client, None
        self._set_status("restarting")
        if old is not None:
            await old.close()
        while True:
            delay = self.policy.on_lost(time.monotonic(), reason)
            if delay is None:
                self.last_error = self.policy.gave_up
                self._set_status("failed")
                log.error("engine replica %d of %s: %s", self.index, self._name, self.last_error)
                return
            if self._spare is None or not self._spare.is_ready():
                await asyncio.sleep(delay)  # a loaded spare takes over without waiting
            try:
                await self._start_engine()
            except Exception as exc:  # EngineUnavailable, or the process could not start
                reason = self.last_error = str(exc)
                self.metrics.engine_crashes.inc()
                log.error("engine replica %d of %s did not start: %s", self.index, self._name, exc)
                continue
            self.metrics.engine_restarts.inc()
            self.metrics.engine_time_to_ready.observe(time.monotonic() - lost_at)
            log.info(
                "engine replica %d of %s is back after %.1f s",
                self.index,
                self._name,
                time.monotonic() - lost_at,
            )
            return

    @property
    def _name(self) -> str:
        return self.config.model.public_name

    def _set_status(self, status: ReplicaStatus) -> None:
        self.status = status
