"""The edge application: FastAPI routes over the served models' engine replicas.

``create_app(config)`` builds the app; its lifespan starts every model's engine replicas (child
processes unless ``supervision.mode = "inprocess"``), supervised, and on shutdown drains (see
:mod:`cadenza.edge.server.lifecycle`) and stops them. Routes: health, readiness, metrics, capacity,
the OpenAI speech API, the WebSocket stream, WebRTC signalling, the admin routes and the
browser page (``/``, ``/static/*``). Every request passes
:class:`~cadenza.edge.server.browser_policy.BrowserPolicy` first (hosts, origins, CORS).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from fastapi import FastAPI, Request, Response
from fastapi.responses import HTMLResponse, JSONResponse
from fastapi.staticfiles import StaticFiles
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from cadenza.config import CadenzaConfig
from cadenza.contract.errors import ENGINE_RETRY_AFTER_S
from cadenza.contract.host_nodes import HostNode
from cadenza.edge.admission.guard import build_guard
from cadenza.edge.admission.shared_client_streams import client_streams_for
from cadenza.edge.admission.shared_rate_limit import SharedRateLimiter, quotas_for
from cadenza.edge.auth.authenticator import Authenticator
from cadenza.edge.replicas.model_service import ModelService
from cadenza.edge.server import admin, client_token_route
from cadenza.edge.server.agent_check import AgentCheckServer, NodeState
from cadenza.edge.server.browser_policy import BrowserPolicy
from cadenza.edge.server.lazy_modules import import_lazy_modules
from cadenza.edge.server.lifecycle import Lifecycle
from cadenza.edge.server.metrics import Metrics
from cadenza.edge.server.node_identity import NODE_HEADER, with_node_label
from cadenza.edge.server.socket_peer import KeepSocketPeer
from cadenza.edge.server.state import EdgeState
from cadenza.edge.streams.checkpoints import checkpoint_store
from cadenza.edge.streams.errors import install_error_handlers
from cadenza.edge.transports import speech_http, webrtc_offer, websocket
from cadenza.loop_lag import LoopLagProbe
from cadenza.version import __version__

log = logging.getLogger(__name__)

_STATIC = Path(__file__).parent / "static"
_INDEX_HTML = _STATIC / "index.html"


def create_app(config: CadenzaConfig, host_node: HostNode | None = None) -> FastAPI:
    """Raises ``ApiKeyFileError`` or ``GuardError`` if the key file or the guard configuration
    cannot be used. ``host_node``: this node's slot among the nodes on its host (``cadenza
    serve`` registers it first thing); the lifespan takes the node's share of the host's cores
    before it starts any engine (:meth:`HostNode.take_share`)."""
    metrics = Metrics()
    guard = build_guard(config.guard)
    auth = Authenticator.from_config(config.auth)
    if auth.is_open:
        log.warning("no API key file: every client may use this server")

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        rate_limiter = quotas_for(config.limits, metrics)
        client_streams = client_streams_for(config.limits, metrics)
        checkpoints = checkpoint_store(config, metrics)
        services: dict[str, ModelService] = {}
        lifecycle = Lifecycle()
        state: EdgeState | None = None
        loop_lag = LoopLagProbe("edge", observe=metrics.edge_loop_lag.observe, watch=True).start()
        import_lazy_modules()
        agent = None
        if config.server.agent_port is not None:
            agent = AgentCheckServer(
                config.server.host, config.server.agent_port, lambda: _node_state(state)
            )
            await agent.start()  # says "down" until every model has loaded
            app.state.agent_port = agent.port
        node_sharers = 1
        if host_node is not None:
            lifecycle.on_drain.append(host_node.close)
            # Nodes started together have registered by now (this runs after the imports):
            # each takes its share before its engines are placed within it.
            share = host_node.take_share()
            node_sharers = share.sharers
            log.info(
                "node %d of those on this host: cores %s%s",
                host_node.slot,
                ",".join(map(str, share.cores)),
                f", shared with {share.sharers - 1} other node(s)" if share.sharers > 1 else "",
            )
        try:
            async with _abandoned_on_request(app):
                for served in config.served_models():  # one at a time: loading is CPU-bound
                    if getattr(app.state, "stop_requested", False):
                        break
                    service = await ModelService.start(
                        served,
                        metrics,
                        rate_limiter,
                        guard,
                        lifecycle,
                        node_sharers=node_sharers,
                        client_streams=client_streams,
                    )
                    services[service.name] = service
                    _log_ready(service)
            app.state.edge = state = EdgeState(
                config=config,
                services=services,
                metrics=metrics,
                auth=auth,
                guard=guard,
                lifecycle=lifecycle,
                checkpoints=checkpoints,
            )
            yield
        finally:
            try:
                for task in list(state.admin_tasks if state is not None else ()):
                    task.cancel()  # a rolling restart must not start engines now
                await lifecycle.drain(0.0)  # a drain that ran before leaves nothing to end
                for session in list(state.webrtc_sessions if state is not None else ()):
                    with contextlib.suppress(Exception):
                        await session.close()
            finally:
                if agent is not None:
                    await agent.stop()
                for service in services.values():
                    await service.close()
                if isinstance(rate_limiter, SharedRateLimiter):
                    await rate_limiter.close()
                await client_streams.aclose()
                if checkpoints is not None:
                    await checkpoints.close()
                loop_lag.cancel()
                if host_node is not None:
                    host_node.close()

    # No generated API pages: the protocols are documented in docs/protocol.md, and an open
    # server should not advertise its routes.
    app = FastAPI(
        title="cadenza",
        version=__version__,
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
    )
    install_error_handlers(app)
    app.include_router(speech_http.router)
    app.include_router(websocket.router)
    app.include_router(webrtc_offer.router)
    app.include_router(client_token_route.router)
    app.include_router(admin.router)

    app.add_middleware(_CountRequests, metrics=metrics)
    app.add_middleware(_NameTheNode, node=config.server.node_name)
    app.add_middleware(KeepSocketPeer, trusted_proxies=config.server.forwarded_allow_ips)
    app.add_middleware(BrowserPolicy, auth=config.auth)  # outermost: before anything else

    # The page's script and style, which its Content-Security-Policy allows only as files.
    app.mount("/static", StaticFiles(directory=_STATIC), name="static")

    @app.get("/", response_class=HTMLResponse)
    async def browser_client() -> HTMLResponse:
        return HTMLResponse(_INDEX_HTML.read_text(encoding="utf-8"))

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz")
    async def readyz(request: Request) -> JSONResponse:
        """Ready while the server is not draining and every served model has an engine
        replica that can take work; each model's replicas and what went wrong with them."""
        state: EdgeState = request.app.state.edge
        ready = not state.lifecycle.draining and all(
            service.is_ready() for service in state.services.values()
        )
        body: dict[str, object] = {
            "status": "ready" if ready else "not ready",
            "streams": sum(service.num_streams for service in state.services.values()),
            "models": {name: service.readiness() for name, service in state.services.items()},
        }
        if state.lifecycle.draining:
            body["status"] = "draining"
        if ready:
            return JSONResponse(body)
        retry = {"Retry-After": str(math.ceil(ENGINE_RETRY_AFTER_S))}
        return JSONResponse(body, status_code=503, headers=retry)

    @app.get("/v1/capacity")
    async def capacity(request: Request) -> JSONResponse:
        """What this server can hold now (see docs/capacity.md)."""
        state: EdgeState = request.app.state.edge
        body = state.default.snapshot().to_json()
        if state.lifecycle.draining:
            body["admission_open"] = False
            body["available_now"] = 0
        if len(state.services) > 1:
            body["models"] = {name: s.snapshot().to_json() for name, s in state.services.items()}
        body["resumable"] = {  # which transports' streams survive what (docs/scaling.md)
            "engine_loss": ["http", "websocket", "webrtc"],
            "node_loss": ["websocket", "webrtc"] if state.checkpoints is not None else [],
        }
        return JSONResponse(body)

    @app.get("/metrics")
    async def prometheus_metrics(request: Request) -> Response:
        state: EdgeState = request.app.state.edge
        for service in state.services.values():
            service.update_gauges()
        metrics.edge_tasks.set(len(asyncio.all_tasks()))
        pending = sum(session.pending for session in state.webrtc_sessions)
        metrics.webrtc_peers.labels(state="pending").set(pending)
        metrics.webrtc_peers.labels(state="connected").set(len(state.webrtc_sessions) - pending)
        exposition = generate_latest(metrics.registry).decode()
        labelled = with_node_label(exposition, config.server.node_name)
        return Response(labelled, media_type=CONTENT_TYPE_LATEST)

    return app


def _node_state(state: EdgeState | None) -> NodeState:
    """What the agent check reads of the node (not ready until every model has loaded)."""
    if state is None:
        return NodeState(draining=False, ready=False, snapshots=())
    services = state.services.values()
    return NodeState(
        draining=state.lifecycle.draining,
        ready=all(service.is_ready() for service in services),
        snapshots=[service.snapshot() for service in services],
        reserved=state.reservations.pending,
    )


def _log_ready(service: ModelService) -> None:
    info = service.identity
    log.info(
        "engine ready: model %s on %s, %d voice(s), %d replica(s), %.1f s to load",
        info.model_name,
        info.device,
        len(info.voices),
        len(service.replicas),
        service.load_s,
    )
    capacity = service.gate.snapshot()
    log.info(
        "capacity of %s: %d real-time streams (real-time limit %d, KV limit %d, %d arriving "
        "at once), step budget %.2f ms, realtime factor %.2f",
        info.model_name,
        capacity.max_streams,
        capacity.limits.realtime,
        capacity.limits.kv_memory,
        capacity.limits.prefill_burst,
        capacity.step_budget_ms,
        capacity.realtime_factor,
    )


@asynccontextmanager
async def _abandoned_on_request(app: FastAPI) -> AsyncIterator[None]:
    """The app's start, which ``app.state.abort_start()`` abandons (a signal while the engines
    load or calibrate, :class:`~cadenza.edge.server.draining_server.DrainingServer`): the
    model being started stops its engines (:meth:`ModelService.start` cleans up when
    cancelled), and the start ends as if complete, with the models started so far, for the
    server to shut down at once."""
    starting = asyncio.current_task()
    abandoned = False

    def abort() -> None:
        nonlocal abandoned
        if starting is not None and not abandoned:
            abandoned = True
            starting.cancel()

    app.state.abort_start = abort
    try:
        yield
        if abandoned:  # asked after the last start returned: the cancel lands here
            await asyncio.sleep(0)
    except asyncio.CancelledError:
        if not abandoned or starting is None:
            raise
        starting.uncancel()
        log.info("start abandoned: the engines that were starting are stopped")
    finally:
        app.state.abort_start = None


class _CountRequests:
    """Counts HTTP requests by route and status (a plain ASGI middleware: Starlette's
    ``BaseHTTPMiddleware`` wraps ``receive`` in a way that hides client disconnects from the
    handlers, which the speech route needs to see while a request waits for capacity)."""

    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = 500

        async def send_with_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, send_with_status)
        finally:
            path = getattr(scope.get("route"), "path", "unmatched")
            self.metrics.http_requests.labels(route=path, status=str(status)).inc()


class _NameTheNode:
    """Adds ``x-cadenza-node`` to every HTTP response (see
    :mod:`~cadenza.edge.server.node_identity`)."""

    def __init__(self, app: ASGIApp, node: str) -> None:
        self.app = app
        self.header = (NODE_HEADER.encode(), node.encode())

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_named(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", ()), self.header]}
            await send(message)

        await self.app(scope, receive, send_named)
