"""One served model at the edge: its engine client, its capacity and admission, its metrics.

A server serves one model per ``[[models]]`` entry (or the one ``[model]``), each in its own
engine process with its own KV pool, calibration and capacity; requests pick one by name.
Clients and their rate limits are the server's, shared by every model.
"""

from __future__ import annotations

import time

from cadenza.config import CadenzaConfig
from cadenza.contract.engine_info import EngineInfo
from cadenza.contract.errors import EngineError
from cadenza.contract.messages import Stats
from cadenza.edge.admission.capacity import CapacityModel
from cadenza.edge.admission.gate import AdmissionGate
from cadenza.edge.admission.guard import TextGuard
from cadenza.edge.admission.rate_limit import RateLimiter
from cadenza.edge.errors import EdgeError
from cadenza.edge.lease import Admission
from cadenza.edge.metrics import Metrics, ModelMetrics
from cadenza.ipc.engine_client import EngineClient


class ModelService:
    """Built around an engine that is ready (its info sizes the capacity model)."""

    def __init__(
        self,
        config: CadenzaConfig,
        engine: EngineClient,
        metrics: ModelMetrics,
        edge_metrics: Metrics,
        rate_limiter: RateLimiter,
        guard: TextGuard | None,
    ) -> None:
        info = engine.info
        assert info is not None, "a model service needs a ready engine"
        self.name = info.model_name
        self.config = config
        self.engine = engine
        self.metrics = metrics
        capacity = CapacityModel(info, config.engine, config.admission)
        self.gate = AdmissionGate(config.admission, capacity, metrics)
        self.admission = Admission(config, engine, self.gate, rate_limiter, guard, edge_metrics)
        self.load_s = 0.0  # seconds its engine took to start

    @classmethod
    async def start(
        cls,
        config: CadenzaConfig,
        edge_metrics: Metrics,
        rate_limiter: RateLimiter,
        guard: TextGuard | None,
    ) -> ModelService:
        """Start the model's engine and wait until it is ready. Raises ``EngineUnavailable``."""
        metrics = ModelMetrics(edge_metrics, config.model.public_name)
        service: ModelService | None = None

        def on_stats(message: Stats) -> None:
            if service is not None:
                service.on_engine_stats(message)
            else:
                metrics.observe_engine_stats(message)

        def on_failure(reason: str) -> None:
            if service is not None:
                service.gate.fail_waiting(f"engine unavailable: {reason}")

        engine = EngineClient(config, on_stats=on_stats, on_failure=on_failure)
        started = time.perf_counter()
        await engine.start()
        service = cls(config, engine, metrics, edge_metrics, rate_limiter, guard)
        service.load_s = time.perf_counter() - started
        return service

    def info(self) -> EngineInfo:
        """The model's identity; :class:`EdgeError` 503 (with ``Retry-After``) while its engine
        cannot take work."""
        try:
            return self.engine.require_ready()
        except EngineError as exc:
            raise EdgeError.from_engine(exc) from exc

    def on_engine_stats(self, message: Stats) -> None:
        """Engine reports feed the metrics and the capacity model."""
        self.metrics.observe_engine_stats(message)
        self.gate.on_engine_stats(message)

    def update_gauges(self) -> None:
        self.metrics.engine_ready.set(1 if self.engine.is_ready() else 0)
        self.gate.update_gauges()
