"""The middleware that applies the server's browser policy before any route
(:mod:`cadenza.edge.server.browser_policy`): foreign origins refused on every route, CORS for
listed origins, preflights answered or refused, untrusted hosts refused, the page's security
headers, and WebSocket upgrades refused with an HTTP response, or closed where the server has
no denial extension. The rules themselves are tested in tests/unit/edge/auth/test_origins.py."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Route, WebSocketRoute
from starlette.testclient import TestClient, WebSocketDenialResponse
from starlette.websockets import WebSocket

from cadenza.config.auth import AuthConfig
from cadenza.edge.server.browser_policy import CONTENT_SECURITY_POLICY, BrowserPolicy

APP_ORIGIN = "https://app.example.com"
HOST = "127.0.0.1:8000"  # where the test client's requests go
WS_URL = f"ws://{HOST}/v1/stream"


def _app(auth: AuthConfig) -> BrowserPolicy:
    async def page(_: Request) -> Response:
        return HTMLResponse("<p>page</p>")

    async def api(_: Request) -> Response:
        return JSONResponse({"ok": True}, headers={"Retry-After": "1"})

    async def stream(websocket: WebSocket) -> None:
        await websocket.accept()
        await websocket.send_text("ready")
        await websocket.close()

    routes = [
        Route("/", page),
        Route("/v1/audio/speech", api, methods=["POST"]),
        Route("/v1/models", api),
        WebSocketRoute("/v1/stream", stream),
    ]
    return BrowserPolicy(Starlette(routes=routes), auth)


def _client(**auth: Any) -> TestClient:
    return TestClient(_app(AuthConfig(**auth)), base_url=f"http://{HOST}")


def _code(response: Any) -> str:
    return str(json.loads(response.content)["error"]["code"])


def test_a_foreign_origin_is_refused_on_every_route() -> None:
    client = _client()
    foreign = {"Origin": "https://evil.example"}
    refused = client.post("/v1/audio/speech", headers=foreign)
    assert refused.status_code == 403 and _code(refused) == "origin_not_allowed"
    assert refused.json()["error"]["type"] == "invalid_request_error"
    assert "access-control-allow-origin" not in refused.headers
    assert client.get("/v1/models", headers=foreign).status_code == 403
    assert client.get("/nowhere", headers=foreign).status_code == 403
    assert client.post("/v1/audio/speech").status_code == 200  # a program: no Origin
    own = client.post("/v1/audio/speech", headers={"Origin": f"http://{HOST}"})
    assert own.status_code == 200 and "access-control-allow-origin" not in own.headers


def test_a_listed_origin_gets_cors_headers() -> None:
    client = _client(allowed_origins=[APP_ORIGIN])
    response = client.post("/v1/audio/speech", headers={"Origin": APP_ORIGIN})
    assert response.status_code == 200
    assert response.headers["access-control-allow-origin"] == APP_ORIGIN
    assert response.headers["vary"] == "Origin"
    exposed = response.headers["access-control-expose-headers"]
    assert {"Retry-After", "x-cadenza-node", "X-Cadenza-Ignored-Fields"} <= set(exposed.split(", "))
    assert "access-control-allow-credentials" not in response.headers
    program = client.post("/v1/audio/speech")
    assert "access-control-allow-origin" not in program.headers
    assert program.headers["vary"] == "Origin"  # a cache must not hand it to a page
    foreign = client.post("/v1/audio/speech", headers={"Origin": "https://evil.example"})
    assert foreign.status_code == 403


def test_preflights_are_answered_for_allowed_origins_only() -> None:
    client = _client(allowed_origins=[APP_ORIGIN])
    asks = {
        "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization",
    }
    answered = client.options("/v1/audio/speech", headers={"Origin": APP_ORIGIN, **asks})
    assert answered.status_code == 204 and answered.content == b""
    assert answered.headers["access-control-allow-origin"] == APP_ORIGIN
    assert answered.headers["access-control-allow-methods"] == "GET, POST"
    assert answered.headers["access-control-allow-headers"] == "Authorization, Content-Type"
    assert answered.headers["access-control-max-age"] == "600"
    for origin in ("https://evil.example", "http://app.example.com", "null"):
        refused = client.options("/v1/audio/speech", headers={"Origin": origin, **asks})
        assert refused.status_code == 403 and _code(refused) == "origin_not_allowed"
        assert "access-control-allow-origin" not in refused.headers
    # An OPTIONS that is no preflight is the route's business (405 here).
    assert client.options("/v1/audio/speech", headers={"Origin": APP_ORIGIN}).status_code == 405


def test_untrusted_hosts_are_refused_before_origins() -> None:
    client = _client(trusted_hosts=["127.0.0.1", "*.example.com"])
    assert client.get("/v1/models").status_code == 200
    assert client.get("/v1/models", headers={"Host": "svc.example.com:8000"}).status_code == 200
    rebound = client.get(
        "/v1/models", headers={"Host": "evil.test:8000", "Origin": "http://evil.test:8000"}
    )
    assert rebound.status_code == 400 and _code(rebound) == "invalid_host"
    assert _code(client.get("/v1/models", headers={"Host": "bad host"})) == "invalid_host"


def test_the_page_carries_its_security_headers() -> None:
    page = _client().get("/")
    assert page.headers["content-security-policy"] == CONTENT_SECURITY_POLICY
    for directive in (
        "default-src 'self'",
        "connect-src 'self'",
        "frame-ancestors 'none'",
        "object-src 'none'",
        "base-uri 'none'",
    ):
        assert directive in CONTENT_SECURITY_POLICY
    assert "unsafe-inline" not in CONTENT_SECURITY_POLICY
    assert page.headers["x-frame-options"] == "DENY"
    assert page.headers["referrer-policy"] == "no-referrer"
    assert page.headers["x-content-type-options"] == "nosniff"
    api = _client().get("/v1/models")
    assert "content-security-policy" not in api.headers
    assert api.headers["x-content-type-options"] == "nosniff"


def test_websocket_upgrades_from_foreign_origins_are_refused_with_http() -> None:
    client = _client(allowed_origins=[APP_ORIGIN], trusted_hosts=["127.0.0.1"])
    for origin in (APP_ORIGIN, f"http://{HOST}", None):
        headers = {"Origin": origin} if origin else {}
        with client.websocket_connect(WS_URL, headers=headers) as ws:
            assert ws.receive_text() == "ready"
    foreign = {"Origin": "https://evil.example"}
    with (
        pytest.raises(WebSocketDenialResponse) as denied,
        client.websocket_connect(WS_URL, headers=foreign),
    ):
        pass
    assert denied.value.status_code == 403 and _code(denied.value) == "origin_not_allowed"
    rebound = {"Host": "evil.test"}
    with (
        pytest.raises(WebSocketDenialResponse) as denied,
        client.websocket_connect(WS_URL, headers=rebound),
    ):
        pass
    assert denied.value.status_code == 400 and _code(denied.value) == "invalid_host"


def test_without_the_denial_extension_an_upgrade_is_closed_before_accept() -> None:
    sent: list[dict[str, Any]] = []
    scope = {
        "type": "websocket",
        "path": "/v1/stream",
        "headers": [(b"host", HOST.encode()), (b"origin", b"https://evil.example")],
        "extensions": {},
    }

    async def receive() -> dict[str, Any]:
        return {"type": "websocket.connect"}

    async def send(message: Any) -> None:
        sent.append(message)

    asyncio.run(_app(AuthConfig())(scope, receive, send))
    assert sent == [{"type": "websocket.close", "code": 1008}]
