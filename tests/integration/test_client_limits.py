"""One client's share of a real server: its open streams (``limits.max_streams_per_client``),
its WebRTC peers waiting to connect (``server.max_pending_webrtc_offers_per_client``) and the
size of its control-channel messages (``server.ws_max_message_bytes``)."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import httpx
import pytest
import websockets
from aiortc import RTCPeerConnection

from cadenza.client.webrtc import WebRTCPeer
from tests.integration.server import serving, wait_until_idle

PENDING_PER_CLIENT = 2
CONNECT_TIMEOUT_S = 3.0


def _server_env() -> dict[str, str]:
    return {
        "CADENZA_LIMITS__MAX_STREAMS_PER_CLIENT": "1",
        "CADENZA_SERVER__MAX_PENDING_WEBRTC_OFFERS_PER_CLIENT": str(PENDING_PER_CLIENT),
        "CADENZA_SERVER__WEBRTC_CONNECT_TIMEOUT_S": str(CONNECT_TIMEOUT_S),
    }


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with serving(tmp_path_factory.mktemp("limits") / "server.log", _server_env()) as running:
        yield running


async def _next_text(ws: websockets.ClientConnection) -> dict[str, Any]:
    """The next JSON message (audio frames skipped)."""
    while isinstance(message := await ws.recv(), bytes):
        pass
    return json.loads(message)


async def _until(ws: websockets.ClientConnection, *kinds: str) -> dict[str, Any]:
    while (message := await _next_text(ws))["type"] not in kinds:
        pass
    return message


def test_a_second_concurrent_stream_is_too_many_until_the_first_ends(server) -> None:
    async def main() -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
        url = server.url.replace("http", "ws") + "/v1/stream"
        async with websockets.connect(url) as first, websockets.connect(url) as second:
            await first.recv()  # ready
            await second.recv()
            long = {"type": "speak", "text": "x" * 2000, "max_duration_s": 60}
            await first.send(json.dumps(long))
            await _until(first, "started")
            await second.send('{"type": "speak", "text": "hi"}')
            refused = await _until(second, "error", "started")
            await first.send('{"type": "cancel"}')
            cancelled = await _until(first, "done")
            await second.send('{"type": "speak", "text": "hi"}')
            done = await _until(second, "done", "error")
            return refused, cancelled, done

    refused, cancelled, done = asyncio.run(main())
    assert refused["type"] == "error" and refused["code"] == "too_many_streams", refused
    assert cancelled["reason"] == "cancelled"
    assert done["type"] == "done", done
    refusals = 'cadenza_stream_refusals_total{code="too_many_streams",transport="websocket"}'
    assert server.metric(refusals) == 1
    wait_until_idle(server)


def test_an_oversized_control_message_is_refused_and_the_peer_goes_on(server) -> None:
    async def main() -> tuple[dict[str, Any], dict[str, Any]]:
        peer = WebRTCPeer(server.url)
        try:
            await peer.connect()
            peer.channel.send(json.dumps({"type": "ping", "data": "x" * 70_000}))
            refused = await peer.next_event({"error", "pong"})
            peer.send({"type": "ping", "data": 7})
            pong = await peer.next_event({"error", "pong"})
            return refused, pong
        finally:
            await peer.close()

    refused, pong = asyncio.run(main())
    assert refused["type"] == "error" and refused["code"] == "message_too_large", refused
    assert pong == {"type": "pong", "data": 7}


def test_one_client_cannot_hold_every_pending_offer(server) -> None:
    async def offer(
        client: httpx.AsyncClient, peers: list[RTCPeerConnection], **headers: str
    ) -> httpx.Response:
        pc = RTCPeerConnection()
        pc.addTransceiver("audio", direction="recvonly")
        pc.createDataChannel("control")
        await pc.setLocalDescription(await pc.createOffer())
        peers.append(pc)
        body = {"sdp": pc.localDescription.sdp, "type": "offer"}
        return await client.post(f"{server.url}/v1/webrtc/offer", json=body, headers=headers)

    async def main() -> list[httpx.Response]:
        peers: list[RTCPeerConnection] = []
        try:
            async with httpx.AsyncClient(timeout=30) as client:
                answers = [await offer(client, peers) for _ in range(PENDING_PER_CLIENT + 1)]
                other = {"X-Forwarded-For": "10.0.0.7"}  # another client behind the local proxy
                return [*answers, await offer(client, peers, **other)]
        finally:
            for pc in peers:
                await pc.close()

    *mine, refused, other = asyncio.run(main())
    assert [answer.status_code for answer in mine] == [200] * PENDING_PER_CLIENT
    assert refused.status_code == 429 and refused.json()["error"]["code"] == "too_many_offers"
    assert int(refused.headers["Retry-After"]) >= 1
    assert other.status_code == 200, other.text
    deadline = time.monotonic() + CONNECT_TIMEOUT_S + 10
    while server.metric("cadenza_webrtc_peers"):  # the peers that never connected are closed
        assert time.monotonic() < deadline, "pending WebRTC peers were left behind"
        time.sleep(0.3)
