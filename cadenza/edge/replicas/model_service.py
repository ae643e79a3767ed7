"""One served model at the edge: its engine replicas, its capacity and admission, its metrics.

A server serves one model per ``[[models]]`` entry (or the one ``[model]``); each model runs on
``supervision.replicas`` engine processes (:class:`EngineReplica`, each supervised, with its own KV
pool and calibration) behind one admission gate that places every stream on a replica.
Requests pick a model by name; clients and their rate limits are the server's, shared by every
model.

When a replica is lost, admission stops placing streams on it and its streams' tickets lose
their replica; each stream's lease then asks the gate for another (see
:meth:`StreamLease.outputs`), and the supervisor restarts the replica. While no replica is
ready, the model refuses new streams with 503 and ``Retry-After``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import time
from dataclasses import replace
from typing import Any

from cadenza.config import CadenzaConfig
from cadenza.contract.cpu_replicas import core_sharers, replica_count, usable_cores
from cadenza.contract.engine_info import EngineInfo
from cadenza.contract.errors import ENGINE_RETRY_AFTER_S, EngineError, EngineUnavailable
from cadenza.contract.messages import Probed, Stats
from cadenza.contract.native_kernels import summary
from cadenza.edge.admission.capacity import CapacityModel
from cadenza.edge.admission.capacity_snapshot import CapacitySnapshot, ReplicaCapacity
from cadenza.edge.admission.client_streams import ClientStreams
from cadenza.edge.admission.factor_memory import FactorMemory, default_dir, measured_under_load
from cadenza.edge.admission.gate import AdmissionGate
from cadenza.edge.admission.guard import TextGuard
from cadenza.edge.admission.rate_limit import Quotas
from cadenza.edge.replicas.replica import REPLICA_STATES, EngineReplica
from cadenza.edge.server.lifecycle import Lifecycle
from cadenza.edge.server.metrics import Metrics
from cadenza.edge.server.model_metrics import ModelMetrics
from cadenza.edge.streams.admission_sequence import Admission
from cadenza.edge.streams.errors import EdgeError
from cadenza.ipc.edge_side.engine_client import EngineClient

log = logging.getLogger(__name__)

_FAILED_RETRY_AFTER_S = 60.0  # a model whose engine gave up restarting needs a person
_FACTOR_SAVE_S = 10.0  # how often a replica's live realtime factor is remembered


class ModelService:
    """Built by :meth:`start`, which brings every replica up."""

    def __init__(
        self,
        config: CadenzaConfig,
        metrics: ModelMetrics,
        edge_metrics: Metrics,
        rate_limiter: Quotas,
        guard: TextGuard | None,
        lifecycle: Lifecycle,
        node_sharers: int = 1,
        client_streams: ClientStreams | None = None,
    ) -> None:
        self.name = config.model.public_name
        self.node_sharers = node_sharers  # nodes on this host sharing its cores (1: its own)
        self.config = config
        self.metrics = metrics
        self.edge_metrics = edge_metrics
        self.rate_limiter = rate_limiter
        self.client_streams = client_streams  # the node's open streams per holder
        self.guard = guard
        self.lifecycle = lifecycle
        self.replicas = [
            EngineReplica(
                config,
                index,
                metrics,
                on_stats=self._on_stats,
                on_probe=self._on_probe,
                on_ready=self._on_ready,
                on_lost=self._on_lost,
                on_recalibrated=self._on_recalibrated,
            )
            for index in range(
                replica_count(
                    config.supervision.replicas,
                    config.model.device,
                    config.supervision.mode,
                    config.engine.kind,
                )
            )
        ]
        self._gate: AdmissionGate | None = None  # once the first replica is ready
        self._admission: Admission | None = None
        self.load_s = 0.0  # seconds the replicas took to start
        self._rolling = asyncio.Lock()
        self._factors = FactorMemory(default_dir(config.calibration.cache_dir))
        self._factor_saved_at: dict[int, float] = {}

    @classmethod
    async def start(
        cls,
        config: CadenzaConfig,
        edge_metrics: Metrics,
        rate_limiter: Quotas,
        guard: TextGuard | None,
        lifecycle: Lifecycle | None = None,
        node_sharers: int = 1,
        client_streams: ClientStreams | None = None,
    ) -> ModelService:
        """Start the model's replicas, all at once, and wait until each is ready: they
        calibrate side by side, so each measures its steps while the others work, as they
        will in service (on a CPU machine replicas share caches and memory bandwidth, or a
        host's sibling threads: one alone runs faster than either beside the other). Raises
        ``EngineUnavailable`` (after stopping every replica). ``node_sharers``: the nodes on
        this host whose engines run on this one's cores too (1: they are its own;
        :class:`~cadenza.contract.cpu_replicas.NodeShare`). ``client_streams``: the node's
        count of open streams per holder, which every model it serves shares (default: the
        model's own)."""
        metrics = ModelMetrics(edge_metrics, config.model.public_name)
        service = cls(
            config,
            metrics,
            edge_metrics,
            rate_limiter,
            guard,
            lifecycle or Lifecycle(),
            node_sharers,
            client_streams,
        )
        started = time.perf_counter()
        starts = [asyncio.ensure_future(replica.start()) for replica in service.replicas]
        try:
            await asyncio.gather(*starts)
        except BaseException:
            for start in starts:
                start.cancel()
            await asyncio.gather(*starts, return_exceptions=True)
            await service.close()
            raise
        service.load_s = time.perf_counter() - started
        return service

    async def close(self) -> None:
        """Stop every replica (streams still open fail ``engine_unavailable``)."""
        for replica in self.replicas:
            await replica.close()

    # -- what routes and transports ask ---------------------------------------------------------

    @property
    def gate(self) -> AdmissionGate:
        assert self._gate is not None, "a started model service has its gate"
        return self._gate

    @property
    def admission(self) -> Admission:
        assert self._admission is not None, "a started model service has its admission"
        return self._admission

    @property
    def identity(self) -> EngineInfo:
        """The model's identity (name, voices, rate) as its engines last announced it; known
        while every replica is down, too."""
        info = next((r.info for r in self.replicas if r.info is not None), None)
        assert info is not None, "a started model service has an engine's info"
        return info

    def is_ready(self) -> bool:
        """Some replica can take streams now."""
        return any(replica.is_ready() for replica in self.replicas)

    def require_ready(self) -> EngineInfo:
        """The model's info; :class:`EngineUnavailable` (with ``Retry-After``) unless some
        replica can take work now."""
        if self.is_ready():
            return self.identity
        failed = [r for r in self.replicas if r.status == "failed"]
        if len(failed) == len(self.replicas):
            raise EngineUnavailable(
                f"model {self.name!r} is down: {failed[0].last_error}", _FAILED_RETRY_AFTER_S
            )
        reason = next((r.last_error for r in self.replicas if r.last_error), None)
        detail = f" (last loss: {reason})" if reason else ""
        raise EngineUnavailable(
            f"no engine of model {self.name!r} is ready; restarting{detail}", ENGINE_RETRY_AFTER_S
        )

    def info(self) -> EngineInfo:
        """The model's identity; :class:`EdgeError` 503 (with ``Retry-After``) while no
        replica can take work."""
        try:
            return self.require_ready()
        except EngineError as exc:
            raise EdgeError.from_engine(exc) from exc

    def client_for(self, replica: int | None) -> EngineClient:
        """The engine client of ``replica``; :class:`EngineUnavailable` when it has none that
        can take work (lost, or restarting)."""
        client = None if replica is None else self.replicas[replica].client
        if client is None:
            raise EngineUnavailable(f"engine replica {replica} of {self.name!r} is not running")
        return client

    @property
    def num_streams(self) -> int:
        return sum(r.client.num_streams for r in self.replicas if r.client is not None)

    def readiness(self) -> dict[str, Any]:
        """``/readyz`` for this model: ready while some replica is; each replica's state;
        whether its calibration agreed with itself (one that did not is served
        conservatively, and says why); and which native kernels its engine loaded, for which
        instruction set, or why not. ``/readyz`` is public: why a replica was lost (its
        exception's text) is only in ``/admin/replicas``."""
        return {
            "status": "ready" if self.is_ready() else "not ready",
            "replicas": [
                {"replica": r.index, "status": r.status}
                | _calibration_state(r.info)
                | _precision_state(r.info)
                | native_kernels_state(r.info)
                for r in self.replicas
            ],
        }

    def snapshot(self) -> CapacitySnapshot:
        """``/v1/capacity`` for this model: the gate's totals and a line per replica, with
        its status."""
        body = self.gate.snapshot()
        by_index = {line.replica: line for line in body.replicas}
        lines = tuple(
            replace(by_index[r.index], status=r.status)
            if r.index in by_index
            else ReplicaCapacity(
                replica=r.index,
                placeable=False,
                max_streams=0,
                active=0,
                kv_pages_free=0,
                step_ms_p50=0.0,
                realtime_factor=0.0,
                admission_open=False,
                prefill_burst=0,
                probes=0,
                status=r.status,
            )
            for r in self.replicas
        )
        body = replace(body, replicas=lines)
        if not self.is_ready():
            body = replace(body, admission_open=False, available_now=0)
        return body

    def update_gauges(self) -> None:
        self.metrics.engine_ready.set(1 if self.is_ready() else 0)
        for state in REPLICA_STATES:
            count = sum(1 for r in self.replicas if r.status == state)
            self.metrics.engine_replicas.labels(state=state).set(count)
        for replica in self.replicas:
            calibration = None if replica.info is None else replica.info.calibration
            if calibration is not None:
                attempts = 0 if calibration.source == "cache" else calibration.attempts
                label = str(replica.index)
                self.metrics.calibration_attempts.labels(replica=label).set(attempts)
                consistent = 1 if calibration.consistent else 0
                self.metrics.calibration_consistent.labels(replica=label).set(consistent)
        if self._gate is not None:
            self._gate.update_gauges()
            claim = self._gate.claim_evidence()
            for basis in ("held", "evidence", "calibrated"):
                self.metrics.claim_streams.labels(basis=basis).set(getattr(claim, basis))
            self.metrics.prefill_burst.set(self._gate.snapshot().limits.prefill_burst)

    # -- rolling restart ----------------------------------------------------------------------

    @property
    def restarting(self) -> bool:
        """A rolling restart is under way."""
        return self._rolling.locked()

    async def rolling_restart(self, drain_timeout_s: float) -> None:
        """Restart the replicas one at a time: each takes no new streams, its streams run on
        until they end (or ``drain_timeout_s``; those still running then resume on another
        replica), then a new engine replaces it and must be ready before the next. A replica
        whose new engine does not come up stops the rollout (the others keep their engines);
        one rolling restart at a time."""
        async with self._rolling:
            for replica in self.replicas:
                if replica.status != "ready":
                    continue  # failed, or being restarted by its supervisor already
                replica.hold()
                self.gate.hold_replica(replica.index)
                deadline = time.monotonic() + drain_timeout_s
                while self.gate.streams_on(replica.index) and time.monotonic() < deadline:
                    await asyncio.sleep(0.05)
                if not await replica.restart():
                    log.error(
                        "rolling restart of %s stopped: replica %d did not come back (%s)",
                        self.name,
                        replica.index,
                        replica.last_error,
                    )
                    return

    # -- replica events -----------------------------------------------------------------------

    def _capacity_of(self, replica: EngineReplica) -> CapacityModel:
        """A capacity model for ``replica`` as its engine announced itself."""
        assert replica.info is not None
        sharers = 1
        if replica.info.device == "cpu":
            sharers = core_sharers(len(self.replicas), len(usable_cores()), self.node_sharers)
        key = self._factor_key(replica)
        return CapacityModel(
            replica.info,
            self.config.admission,
            core_sharers=sharers,
            remembered=None if key is None else self._factors.recall(key),
        )

    def _on_ready(self, replica: EngineReplica) -> None:
        assert replica.info is not None
        self.metrics.set_native_kernels(replica.index, replica.info.native_kernels)
        capacity = self._capacity_of(replica)
        if self._gate is None:
            self._gate = AdmissionGate(self.config.admission, capacity, self.metrics)
            self._gate.placeable.clear()
            self._gate.replicas.clear()
            self._admission = Admission(
                self.config,
                self,
                self._gate,
                self.rate_limiter,
                self.guard,
                self.edge_metrics,
                lifecycle=self.lifecycle,
                model_metrics=self.metrics,
                client_streams=self.client_streams,
            )
        self.gate.set_replica(replica.index, capacity)

    def _on_recalibrated(self, replica: EngineReplica) -> None:
        """``replica``'s engine measured its steps again (it had served with a conservative
        calibration, taken while the machine was busy): admission prices it afresh, as a
        restarted replica (the streams it holds stay admitted; a replica held for a rolling
        restart stays held)."""
        calibration = None if replica.info is None else replica.info.calibration
        if calibration is None:
            return
        log.info(
            "engine replica %d of %s measured its steps again on a quiet machine: %s",
            replica.index,
            self.name,
            ", ".join(f"{t} streams {ms:.2f} ms" for t, _, ms in calibration.model.decode_points),
        )
        if self._gate is not None and replica.index in self.gate.placeable:
            self.gate.set_replica(replica.index, self._capacity_of(replica))

    def _on_lost(self, replica: EngineReplica, reason: str) -> None:
        self.metrics.forget_replica(replica.index)
        if self._gate is None:
            return
        self.gate.replica_lost(replica.index)
        if not self.gate.placeable:
            self.gate.fail_waiting(f"engine unavailable: {reason}")

    def _on_stats(self, replica: EngineReplica, message: Stats) -> None:
        """Engine reports feed the metrics and the replica's capacity model (whose live
        realtime factor is remembered for the next server, every ``_FACTOR_SAVE_S`` while the
        replica is loaded: :func:`factor_memory.measured_under_load`)."""
        self.metrics.observe_engine_stats(message, replica.index)
        if self._gate is None:
            return
        self.gate.on_engine_stats(message, replica.index)
        capacity = self.gate.replicas.get(replica.index)
        now = time.monotonic()
        if capacity is not None and message.stats.num_requests == 0:
            self._maybe_probe(replica, capacity)
        key = self._factor_key(replica)
        saved_at = self._factor_saved_at.get(replica.index, -math.inf)
        if capacity is None or key is None or now - saved_at < _FACTOR_SAVE_S:
            return
        loaded = measured_under_load(message.stats.num_running, capacity.realtime_limit())
        if capacity.estimator.has_live_factor() and loaded:
            self._factors.remember_soon(key, capacity.realtime_factor())
            self._factor_saved_at[replica.index] = now

    def _maybe_probe(self, replica: EngineReplica, capacity: CapacityModel) -> None:
        """Ask ``replica``'s idle engine for a probe when its capacity model wants one
        (:meth:`RealtimeFactorEstimator.probe_due`), at the batch the claim would hold at the
        serving floor (docs/capacity.md, "Recovery")."""
        if replica.client is None or not capacity.estimator.probe_due():
            return
        batch = capacity.max_streams(capacity.estimator.serving_floor)
        capacity.estimator.probe_asked()
        replica.client.probe(batch, self.config.admission.probe_max_ms)

    def _on_probe(self, replica: EngineReplica, message: Probed) -> None:
        """A probe ran: its steps go to the replica's capacity model (which may raise the
        claim, and admit whoever waits)."""
        counted = False
        if self._gate is not None and message.batch > 0:
            counted = self.gate.on_probe(message.report, replica.index)
        outcome = message.outcome if counted or message.batch == 0 else "uncounted"
        self.metrics.probes.labels(outcome=outcome).inc()
        log.debug(
            "probe of replica %d of %s: %s at %d streams, %d steps",
            replica.index,
            self.name,
            message.outcome,
            message.batch,
            len(message.report.steps),
        )

    def _factor_key(self, replica: EngineReplica) -> str | None:
        """What a remembered realtime factor is kept under: the replica's calibration (model,
        device, kernels), how many replicas share the machine and which one it is."""
        info = replica.info
        if info is None or info.calibration is None:
            return None
        return f"{info.calibration.identity}/{len(self.replicas)}/{replica.index}"


def _precision_state(info: EngineInfo | None) -> dict[str, Any]:
    """What ``/readyz`` says of the dtypes a replica computes in (nothing while unknown)."""
    precision = None if info is None else info.precision
    if precision is None:
        return {}
    return {"precision": dataclasses.asdict(precision)}


def native_kernels_state(info: EngineInfo | None) -> dict[str, Any]:
    """What ``/readyz`` says of a replica's native kernels: a one-line summary (without a
    C++ compiler: that they are off and the CPU's work runs on torch paths) and each library's
    status, level and ISA, and why it is off (nothing for an engine that reports none)."""
    kernels = () if info is None else info.native_kernels
    if not kernels:
        return {}
    libraries = {
        kernel.library: {"status": kernel.status, "level": kernel.level, "isa": kernel.isa}
        | ({"detail": kernel.detail} if kernel.detail else {})
        for kernel in kernels
    }
    return {"native_kernels": {"summary": summary(kernels), "libraries": libraries}}


def _calibration_state(info: EngineInfo | None) -> dict[str, Any]:
    """What ``/readyz`` says of a replica's calibration (nothing without one)."""
    calibration = None if info is None else info.calibration
    if calibration is None:
        return {}
    state: dict[str, Any] = {
        "consistent": calibration.consistent,
        "source": calibration.source,
        "attempts": calibration.attempts,
    }
    if not calibration.consistent:
        state["problems"] = list(calibration.problems)
        state["note"] = "serving with a conservative calibration (not cached)"
    return {"calibration": state}
