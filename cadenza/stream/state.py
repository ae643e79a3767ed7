"""What the edge's request handlers share: configuration, the engine client, metrics."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from cadenza.admission.api_keys import ApiKeys, bearer_token
from cadenza.admission.capacity import CapacityModel
from cadenza.admission.gate import (
    ENGINE_RETRY_AFTER_S,
    AdmissionGate,
    AdmissionRefused,
    QueuedCallback,
    Ticket,
)
from cadenza.admission.guard import TextGuard, run_guard
from cadenza.admission.priority_queues import Priority
from cadenza.admission.rate_limit import Grant, RateLimiter
from cadenza.config import CadenzaConfig
from cadenza.engine.engine_client import EngineClient
from cadenza.engine.messages import EngineInfo
from cadenza.engine.request import SynthesisRequest, request_duration_s
from cadenza.stream.errors import ApiError
from cadenza.telemetry import Metrics


@dataclass
class EdgeState:
    config: CadenzaConfig
    engine: EngineClient
    metrics: Metrics
    started_at: int = field(default_factory=lambda: int(time.time()))
    webrtc_sessions: set[Any] = field(default_factory=set)  # live WebRTCSession objects
    api_keys: ApiKeys | None = None  # None: the server is open
    rate_limiter: RateLimiter | None = None
    guard: TextGuard | None = None
    gate: AdmissionGate | None = None  # built from the engine's info once it is ready

    def __post_init__(self) -> None:
        limits = self.config.limits
        if self.rate_limiter is None:
            self.rate_limiter = RateLimiter(
                limits.requests_per_minute, limits.audio_seconds_per_minute
            )
        if self.gate is None and self.engine.info is not None:
            capacity = CapacityModel(self.engine.info, self.config.engine, self.config.admission)
            self.gate = AdmissionGate(self.config.admission, capacity, self.metrics)

    def on_engine_failure(self, reason: str) -> None:
        """The engine is gone: requests waiting for a slot are refused now, not at timeout."""
        if self.gate is not None:
            self.gate.fail_waiting(f"engine unavailable: {reason}")

    def on_engine_stats(self, stats: dict[str, Any]) -> None:
        """Engine reports feed the metrics and the capacity model."""
        self.metrics.observe_engine_stats(stats)
        if self.gate is not None:
            self.gate.on_engine_stats(stats)

    async def acquire_slot(
        self,
        request: SynthesisRequest,
        priority: Priority,
        on_queued: QueuedCallback | None = None,
    ) -> Ticket:
        """Wait for admission of ``request``; raises :class:`AdmissionRefused`. Every ticket
        must be given back with :meth:`release_slot` once its engine request has ended."""
        assert self.gate is not None
        if not self.engine.is_ready():
            raise AdmissionRefused(
                "engine_unavailable", "engine is not ready", ENGINE_RETRY_AFTER_S
            )
        prompt_s = (
            len(request.prompt_audio) / 4 / request.prompt_sample_rate
            if request.prompt_audio
            else 0.0
        )
        cost = self.gate.capacity.stream_cost(
            request.text, self.audio_seconds(request.text, request.max_duration_s), prompt_s
        )
        return await self.gate.acquire(priority, cost, on_queued)

    def release_slot(self, ticket: Ticket) -> None:
        """Give an admission slot back (idempotent)."""
        if self.gate is not None:
            self.gate.release(ticket)

    def audio_seconds(self, text: str, max_duration_s: float | None) -> float:
        """Audio a request may produce (its duration, as the engine derives it)."""
        return request_duration_s(text, max_duration_s, self.config.limits)

    def authenticate(self, authorization: str | None, peer: str | None) -> str:
        """Check an ``Authorization`` header; 401 unless the key is valid or none is needed.
        Returns the client's identity for rate limits: its key's id, or its address."""
        if self.api_keys is None:
            return f"ip:{peer}"
        key_id = self.api_keys.check(bearer_token(authorization))
        if key_id:
            return f"key:{key_id}"
        raise ApiError(
            401,
            "missing or invalid API key (send Authorization: Bearer <key>)",
            code="invalid_api_key",
            headers={"WWW-Authenticate": "Bearer"},
        )

    def admit(self, client: str, text: str, max_duration_s: float | None) -> Grant:
        """Charge a request to ``client``'s buckets; raises :class:`RateLimited`."""
        assert self.rate_limiter is not None
        return self.rate_limiter.admit(client, self.audio_seconds(text, max_duration_s))

    def settle(self, grant: Grant, audio_s: float) -> None:
        assert self.rate_limiter is not None
        self.rate_limiter.settle(grant, audio_s)

    async def screen(self, text: str, client: str) -> str | None:
        """Run the input guard; the refusal reason, or ``None`` when the text may be spoken."""
        verdict = await run_guard(self.guard, text, self.config.guard, client)
        return None if verdict.allowed else verdict.reason or "refused by the input guard"

    def engine_info(self) -> EngineInfo:
        """The loaded model's identity; 503 while the engine is not ready."""
        if not self.engine.is_ready() or self.engine.info is None:
            raise ApiError(503, "engine is not ready", code="engine_unavailable")
        return self.engine.info
