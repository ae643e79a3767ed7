"""Behind a front door every connection comes from the proxy: the node names the client by
``X-Forwarded-For`` when the proxy is one of ``server.forwarded_allow_ips`` (default: this
host, where a local HAProxy runs), so per-client limits stay per client; from any other
address the header is ignored, so a client cannot pick its own identity."""

from __future__ import annotations

import asyncio

import httpx
import websockets

from tests.integration.server import RunningServer, serving

ONE_A_MINUTE = {"CADENZA_LIMITS__REQUESTS_PER_MINUTE": "1"}
SHORT = {"model": "cadenza-tiny", "input": "hi", "response_format": "pcm"}


def _status_as(server: RunningServer, client: str) -> httpx.Response:
    headers = {"X-Forwarded-For": client}
    return httpx.post(f"{server.url}/v1/audio/speech", json=SHORT, headers=headers, timeout=60)


def _speak_over_websocket_as(server: RunningServer, client: str) -> str:
    """The type of the server's first answer to one ``speak`` (``started`` or ``error``)."""

    async def main() -> str:
        url = server.url.replace("http", "ws") + "/v1/stream"
        headers = {"X-Forwarded-For": client}
        async with websockets.connect(url, additional_headers=headers) as ws:
            await ws.recv()  # ready
            await ws.send('{"type": "speak", "text": "hi"}')
            while isinstance(answer := await ws.recv(), bytes):
                pass
            return str(answer)

    return asyncio.run(main())


def test_clients_behind_a_trusted_proxy_get_their_own_limits(tmp_path) -> None:
    with serving(tmp_path / "server.log", ONE_A_MINUTE) as server:
        assert _status_as(server, "203.0.113.1").status_code == 200
        refused = _status_as(server, "203.0.113.1")
        assert refused.status_code == 429 and refused.json()["error"]["code"] == "rate_limited"
        assert _status_as(server, "203.0.113.2").status_code == 200  # another client
        # A client's own header before the proxy's: the proxy appends the address it saw.
        assert _status_as(server, "203.0.113.2, 203.0.113.3").status_code == 200
        assert '"started"' in _speak_over_websocket_as(server, "203.0.113.4")
        assert "rate_limited" in _speak_over_websocket_as(server, "203.0.113.4")


def test_the_header_from_an_untrusted_address_is_ignored(tmp_path) -> None:
    env = {**ONE_A_MINUTE, "CADENZA_SERVER__FORWARDED_ALLOW_IPS": '["192.0.2.10"]'}
    with serving(tmp_path / "server.log", env) as server:
        assert _status_as(server, "203.0.113.1").status_code == 200
        assert _status_as(server, "203.0.113.2").status_code == 429  # both are 127.0.0.1
