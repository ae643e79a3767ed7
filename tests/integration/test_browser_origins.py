"""A real server with a key file and ``auth.allowed_origins``: a page of another origin is
refused (403 ``origin_not_allowed``) on the WebSocket upgrade, before its key is even read, and
on the WebRTC offer; the listed origin, the server's own page and programs (no ``Origin``) get
through; CORS preflights are answered for the listed origin only; the page carries its
Content-Security-Policy and its script is a file; ``/readyz`` tells no engine's error."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time

import httpx
import pytest
import websockets
from websockets.exceptions import InvalidStatus

from tests.integration.server import RunningServer, serving

KEY = "browser-origins-key"
APP_ORIGIN = "https://app.example.com"
FOREIGN = "https://evil.example"
AUTHORIZED = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    directory = tmp_path_factory.mktemp("origins")
    (directory / "keys").write_text(f"{KEY}\n")
    env = {
        "CADENZA_AUTH__API_KEYS_FILE": str(directory / "keys"),
        "CADENZA_AUTH__ALLOWED_ORIGINS": json.dumps([APP_ORIGIN]),
        # A lost engine waits this long before its restart: /readyz is read meanwhile.
        "CADENZA_SUPERVISION__RESTART_BACKOFF_S": "5",
    }
    with serving(directory / "server.log", env) as running:
        yield running


def _first_message(server: RunningServer, origin: str | None) -> dict[str, object]:
    """The server's first message on a WebSocket opened with the key and this ``Origin``."""

    async def main() -> dict[str, object]:
        url = server.url.replace("http", "ws") + "/v1/stream"
        headers = {**AUTHORIZED, **({"Origin": origin} if origin else {})}
        async with websockets.connect(url, additional_headers=headers) as ws:
            return dict(json.loads(await ws.recv()))

    return asyncio.run(main())


def test_a_foreign_page_cannot_open_a_websocket_even_with_a_key(server) -> None:
    with pytest.raises(InvalidStatus) as refused:
        _first_message(server, FOREIGN)
    response = refused.value.response
    assert response.status_code == 403
    assert json.loads(response.body)["error"]["code"] == "origin_not_allowed"
    assert _first_message(server, APP_ORIGIN)["type"] == "ready"
    assert _first_message(server, server.url)["type"] == "ready"  # the server's own page
    assert _first_message(server, None)["type"] == "ready"  # a program


def test_a_foreign_page_cannot_offer_webrtc(server) -> None:
    offer = {"sdp": "v=0", "type": "offer"}
    url = f"{server.url}/v1/webrtc/offer"
    refused = httpx.post(url, json=offer, headers={**AUTHORIZED, "Origin": FOREIGN}, timeout=10)
    assert refused.status_code == 403
    assert refused.json()["error"]["code"] == "origin_not_allowed"
    assert "access-control-allow-origin" not in refused.headers
    # Without the policy the offer is judged on its merits: this one is no SDP.
    listed = httpx.post(url, json=offer, headers={**AUTHORIZED, "Origin": APP_ORIGIN}, timeout=10)
    assert listed.status_code == 400 and listed.headers["access-control-allow-origin"] == APP_ORIGIN


def test_cors_answers_the_listed_origin_only(server) -> None:
    asks = {
        "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization",
    }
    url = f"{server.url}/v1/audio/speech"
    answered = httpx.options(url, headers={"Origin": APP_ORIGIN, **asks}, timeout=10)
    assert answered.status_code == 204
    assert answered.headers["access-control-allow-origin"] == APP_ORIGIN
    assert "Authorization" in answered.headers["access-control-allow-headers"]
    refused = httpx.options(url, headers={"Origin": FOREIGN, **asks}, timeout=10)
    assert refused.status_code == 403 and "access-control-allow-origin" not in refused.headers
    body = {"model": "cadenza-tiny", "input": "hi", "response_format": "pcm"}
    speech = httpx.post(url, json=body, headers={**AUTHORIZED, "Origin": APP_ORIGIN}, timeout=60)
    assert speech.status_code == 200
    assert speech.headers["access-control-allow-origin"] == APP_ORIGIN
    assert "x-cadenza-node" in speech.headers["access-control-expose-headers"]
    assert "x-cadenza-node" in speech.headers


def test_the_page_carries_its_policy_and_loads_its_script_as_a_file(server) -> None:
    page = httpx.get(f"{server.url}/", timeout=10)
    policy = page.headers["content-security-policy"]
    assert "default-src 'self'" in policy and "frame-ancestors 'none'" in policy
    assert "unsafe-inline" not in policy
    assert page.headers["x-frame-options"] == "DENY"
    assert '<script src="/static/app.js">' in page.text and "<style>" not in page.text
    script = httpx.get(f"{server.url}/static/app.js", timeout=10)
    assert script.status_code == 200 and "javascript" in script.headers["content-type"]
    assert script.headers["x-content-type-options"] == "nosniff"
    style = httpx.get(f"{server.url}/static/app.css", timeout=10)
    assert style.status_code == 200 and style.headers["content-type"].startswith("text/css")


def test_readyz_tells_no_engine_error(server) -> None:
    """The last test of the module: it kills the engine."""
    (pid,) = server.engine_pids()
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while True:
        assert time.monotonic() < deadline, "the lost engine was never reported"
        error = _last_error(server)
        if error is None:
            time.sleep(0.1)
            continue
        ready = httpx.get(f"{server.url}/readyz", timeout=10)
        if _last_error(server) == error:  # the error stood while /readyz was read
            break
    assert ready.status_code == 503
    replica = ready.json()["models"]["cadenza-tiny"]["replicas"][0]
    assert replica["status"] == "restarting" and "error" not in replica
    assert error not in ready.text


def _last_error(server: RunningServer) -> str | None:
    replicas = httpx.get(f"{server.url}/admin/replicas", headers=AUTHORIZED, timeout=10).json()
    error: str | None = replicas["models"]["cadenza-tiny"][0]["last_error"]
    return error
