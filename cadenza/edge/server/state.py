"""What the edge's request handlers share: the configuration, the served models (each with
its engine and admission), the metrics, and who may connect."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from cadenza.config import CadenzaConfig
from cadenza.contract.engine_info import EngineInfo
from cadenza.contract.errors import EngineError
from cadenza.edge.admission.guard import TextGuard
from cadenza.edge.admission.session_reservations import Reservation, SessionReservations
from cadenza.edge.auth.api_keys import bearer_token
from cadenza.edge.auth.authenticator import Authenticator
from cadenza.edge.auth.principal import Principal
from cadenza.edge.replicas.model_service import ModelService
from cadenza.edge.server.lifecycle import Lifecycle
from cadenza.edge.server.metrics import Metrics
from cadenza.edge.server.node_headroom import free_streams
from cadenza.edge.streams.errors import EdgeError
from cadenza.edge.streams.lease import Transport

if TYPE_CHECKING:
    from cadenza.edge.streams.checkpoints import CheckpointStore
    from cadenza.edge.transports.webrtc import WebRTCSession

# What an ``at_capacity`` refusal's Retry-After says: it asks for another node now, not for a
# wait here (a client that wants to wait connects without the spill header and queues).
SPILL_RETRY_AFTER_S = 1.0


@dataclass
class EdgeState:
    """What every handler shares. ``services``: the served models by name, the first the
    default (for requests that name none)."""

    config: CadenzaConfig
    services: dict[str, ModelService]
    metrics: Metrics
    auth: Authenticator = field(default_factory=Authenticator)  # no keys: the server is open
    guard: TextGuard | None = None
    started_at: int = field(default_factory=lambda: int(time.time()))
    webrtc_sessions: set[WebRTCSession] = field(default_factory=set)
    lifecycle: Lifecycle = field(default_factory=Lifecycle)
    admin_tasks: set[asyncio.Task[None]] = field(default_factory=set)  # drains, restarts
    checkpoints: CheckpointStore | None = None  # with limits.redis_url: streams resume anywhere
    # Streams promised to WebSocket sessions accepted whose first utterance is not admitted yet.
    reservations: SessionReservations = field(default_factory=SessionReservations)

    @property
    def default(self) -> ModelService:
        return next(iter(self.services.values()))

    def service(self, model: str | None, transport: Transport | None = None) -> ModelService:
        """The service for ``model`` (``None``: the default); :class:`EdgeError` 400
        ``model_not_found`` naming the models served. With ``transport``,
        a refusal counts as a refused stream request, as admission counts its own."""
        if model is None:
            return self.default
        service = self.services.get(model)
        if service is None:
            available = ", ".join(repr(name) for name in self.services)
            if transport is not None:
                self.metrics.stream_requests.labels(transport=transport).inc()
                self.metrics.stream_refusals.labels(
                    transport=transport, code="model_not_found"
                ).inc()
            raise EdgeError(
                400,
                f"model {model!r} is not served here; available: {available}",
                code="model_not_found",
                param="model",
            )
        return service

    def native_rate(self, model: str | None, default: EngineInfo) -> int:
        """The sample rate of ``model``'s codec (``default``'s for ``None``, and for a model
        that cannot be asked now: opening its utterance then says why)."""
        if model is None:
            return default.sample_rate
        try:
            return self.service(model).info().sample_rate
        except (EdgeError, EngineError):
            return default.sample_rate

    def codes_as_ids(self, model: str | None, default: EngineInfo) -> bool:
        """Whether ``model``'s codec frames are ids the ``encodec`` format can send
        (``default``'s for ``None`` or a model that cannot be asked now)."""
        if model is None:
            return default.codes_as_ids
        try:
            return self.service(model).info().codes_as_ids
        except (EdgeError, EngineError):
            return default.codes_as_ids

    # -- room for a new session ------------------------------------------------------------

    @property
    def spills(self) -> bool:
        """Whether this node is one of a fleet behind a front door (it answers the HAProxy
        agent check, ``server.agent_port``): only then does a full node refuse a spilling
        upgrade, and ``ready.features`` lists ``spill``."""
        return self.config.server.agent_port is not None

    def reserve_session(self, spill: bool) -> Reservation | None:
        """A reservation for a WebSocket session about to be accepted, when the node could
        start one more stream at once (its free streams over every served model, less those
        reserved already); ``None`` when it could not. With ``spill`` (the client's
        ``X-Cadenza-Spill: 1``) no room raises :class:`EdgeError` 503 ``at_capacity`` instead,
        so that a front door tries another node; it counts as a refused WebSocket stream
        (``cadenza_stream_refusals_total{code="at_capacity"}``: how often this node sent a
        session elsewhere). Only a node in a fleet (:attr:`spills`) reserves or refuses: a node
        alone has nowhere to spill to, and its sessions queue as they always did (``None``, at
        no cost)."""
        if not self.spills:
            return None
        snapshots = [service.snapshot() for service in self.services.values()]
        reservation = self.reservations.reserve(free_streams(snapshots))
        if reservation is None and spill:
            self.metrics.stream_requests.labels(transport="websocket").inc()
            self.metrics.stream_refusals.labels(transport="websocket", code="at_capacity").inc()
            raise EdgeError(
                503,
                "this node cannot start another stream at once; another node may (or connect "
                "without X-Cadenza-Spill to wait in this node's queue)",
                code="at_capacity",
                retry_after_s=SPILL_RETRY_AFTER_S,
            )
        return reservation

    # -- who is asking ----------------------------------------------------------------------

    def authenticate(
        self, authorization: str | None, peer: str | None, origin: str | None = None
    ) -> Principal:
        """Who sends this ``Authorization: Bearer`` header (a key or a client token) from
        ``peer`` with ``Origin`` ``origin``; raises :class:`EdgeError` 401 unless the
        credential is valid or none is needed (see
        :class:`~cadenza.edge.auth.authenticator.Authenticator`)."""
        return self.auth.principal(bearer_token(authorization), peer, origin)

    def engine_info(self, model: str | None = None) -> EngineInfo:
        """The model's identity (see :meth:`service`); :class:`EdgeError` 503 (with
        ``Retry-After``) while its engine cannot take work."""
        return self.service(model).info()
