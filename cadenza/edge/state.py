"""What the edge's request handlers share: the configuration, the engine client, the metrics,
who may connect, and the admission every stream goes through."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from cadenza.config import CadenzaConfig
from cadenza.contract.engine_info import EngineInfo
from cadenza.contract.errors import EngineError
from cadenza.contract.messages import Stats
from cadenza.edge.admission.api_keys import ApiKeys, bearer_token
from cadenza.edge.admission.capacity import CapacityModel
from cadenza.edge.admission.gate import AdmissionGate
from cadenza.edge.admission.guard import TextGuard
from cadenza.edge.admission.rate_limit import RateLimiter
from cadenza.edge.errors import EdgeError
from cadenza.edge.lease import Admission
from cadenza.edge.metrics import Metrics
from cadenza.ipc.engine_client import EngineClient

if TYPE_CHECKING:
    from cadenza.edge.webrtc import WebRTCSession


@dataclass
class EdgeState:
    """Built once the engine is ready (its info sizes the capacity model)."""

    config: CadenzaConfig
    engine: EngineClient
    metrics: Metrics
    api_keys: ApiKeys | None = None  # None: the server is open
    guard: TextGuard | None = None
    started_at: int = field(default_factory=lambda: int(time.time()))
    webrtc_sessions: set[WebRTCSession] = field(default_factory=set)

    def __post_init__(self) -> None:
        info = self.engine.info
        assert info is not None, "the edge state needs a ready engine"
        limits = self.config.limits
        capacity = CapacityModel(info, self.config.engine, self.config.admission)
        self.gate = AdmissionGate(self.config.admission, capacity, self.metrics)
        self.admission = Admission(
            self.config,
            self.engine,
            self.gate,
            RateLimiter(limits.requests_per_minute, limits.audio_seconds_per_minute),
            self.guard,
            self.metrics,
        )

    # -- who is asking ----------------------------------------------------------------------

    def client_identity(self, api_key: str | None, peer: str | None) -> str | None:
        """The client's identity for rate limits: its key's id, or its address when the server
        is open; ``None`` when a key is required and ``api_key`` is not a valid one."""
        if self.api_keys is None:
            return f"ip:{peer}"
        key_id = self.api_keys.check(api_key)
        return f"key:{key_id}" if key_id else None

    def authenticate(self, authorization: str | None, peer: str | None) -> str:
        """Check an ``Authorization: Bearer`` header; raises :class:`EdgeError` 401 unless the
        key is valid or none is needed. Returns the client's identity."""
        client = self.client_identity(bearer_token(authorization), peer)
        if client is None:
            raise EdgeError(
                401,
                "missing or invalid API key (send Authorization: Bearer <key>)",
                code="invalid_api_key",
                headers={"WWW-Authenticate": "Bearer"},
            )
        return client

    def engine_info(self) -> EngineInfo:
        """The loaded model's identity; :class:`EdgeError` 503 (with ``Retry-After``) while
        no engine can take work."""
        try:
            return self.engine.require_ready()
        except EngineError as exc:
            raise EdgeError.from_engine(exc) from exc

    # -- what the engine says ---------------------------------------------------------------

    def on_engine_stats(self, message: Stats) -> None:
        """Engine reports feed the metrics and the capacity model."""
        self.metrics.observe_engine_stats(message)
        self.gate.on_engine_stats(message)

    def on_engine_failure(self, reason: str) -> None:
        """The engine is gone: requests waiting for a slot are refused now, not at timeout."""
        self.gate.fail_waiting(f"engine unavailable: {reason}")
