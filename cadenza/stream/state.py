"""What the edge's request handlers share: configuration, the engine client, metrics."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from cadenza.admission.api_keys import ApiKeys, bearer_token
from cadenza.config import CadenzaConfig
from cadenza.engine.engine_client import EngineClient
from cadenza.engine.messages import EngineInfo
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

    def authenticate(self, authorization: str | None) -> None:
        """Check an ``Authorization`` header; 401 unless the key is valid or none is needed."""
        if self.api_keys is None or self.api_keys.check(bearer_token(authorization)):
            return
        raise ApiError(
            401,
            "missing or invalid API key (send Authorization: Bearer <key>)",
            code="invalid_api_key",
            headers={"WWW-Authenticate": "Bearer"},
        )

    def engine_info(self) -> EngineInfo:
        """The loaded model's identity; 503 while the engine is not ready."""
        if not self.engine.is_ready() or self.engine.info is None:
            raise ApiError(503, "engine is not ready", code="engine_unavailable")
        return self.engine.info
