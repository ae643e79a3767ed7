"""WebRTC through a TURN relay with credentials that expire: coturn checks them against the
secret it shares with the server (``use-auth-secret``); the server, configured with that
secret, makes credentials for its own peers and for each client in ``GET /v1/webrtc/config``
(which takes the client's key). An aiortc peer that may only use relayed candidates (as a
client behind a strict NAT) and the server reach each other through the relay on loopback;
a credential past its expiry gets no allocation."""

from __future__ import annotations

import asyncio
import json
import re
import time
from typing import Any

import httpx
import pytest
from aioice.stun import TransactionFailed
from aioice.turn import create_turn_endpoint
from aiortc import RTCConfiguration, RTCIceServer, RTCIceTransportPolicy

from cadenza.client.webrtc import ReceivedAudio, WebRTCPeer
from cadenza.edge.transports.turn_credentials import turn_credential
from tests.integration.server import serving
from tests.support.turn_process import SECRET, TurnRelay

KEY = "relay-test-stream-key"


def test_a_relay_only_peer_streams_through_the_turn_server(tmp_path) -> None:
    relay = TurnRelay(tmp_path)
    (tmp_path / "keys").write_text(KEY + "\n")
    try:
        env = {
            "CADENZA_SERVER__WEBRTC_ICE_SERVERS": json.dumps(
                [{"urls": [relay.url], "secret": SECRET}]
            ),
            "CADENZA_AUTH__API_KEYS_FILE": str(tmp_path / "keys"),
        }
        with serving(tmp_path / "server.log", env) as server:
            url = f"{server.url}/v1/webrtc/config"
            assert httpx.get(url, timeout=10).status_code == 401
            answer = httpx.get(url, headers={"Authorization": f"Bearer {KEY}"}, timeout=10)
            assert answer.status_code == 200 and SECRET not in answer.text
            [ice] = answer.json()["ice_servers"]
            expires_at, _, subject = ice["username"].partition(":")
            assert ice["urls"] == [relay.url] and subject.startswith("key:")
            assert time.time() < int(expires_at) <= time.time() + 3600 + 1

            async def main() -> tuple[str, dict[str, Any], ReceivedAudio]:
                relayed = RTCConfiguration(
                    iceServers=[RTCIceServer(**ice)],
                    iceTransportPolicy=RTCIceTransportPolicy.RELAY,
                )
                peer = WebRTCPeer(server.url, configuration=relayed, api_key=KEY)
                try:
                    await peer.connect()
                    offered = peer.pc.localDescription.sdp
                    peer.send({"type": "speak", "text": "x" * 28, "seed": 1})
                    done = await peer.next_event({"done", "error"})
                    await asyncio.sleep(0.3)
                    return offered, done, peer.result
                finally:
                    await peer.close()

            offered, done, result = asyncio.run(main())
        candidates = [line for line in offered.split("\r\n") if line.startswith("a=candidate:")]
        assert candidates and all(" typ relay " in c for c in candidates)
        assert done["type"] == "done" and done["reason"] == "length"
        assert result.loud_samples() > 10_000
    finally:
        relay.stop()
    # the client's allocation and the node's own peer's, each under its own credential
    log = relay.log()
    assert f"user <{ice['username']}>: incoming packet ALLOCATE processed, success" in log
    assert re.search(r"user <\d+:node:[^>]+>: incoming packet ALLOCATE processed, success", log)


async def _allocate(relay: TurnRelay, username: str, credential: str) -> None:
    transport, _ = await create_turn_endpoint(
        asyncio.DatagramProtocol,
        server_addr=("127.0.0.1", relay.port),
        username=username,
        password=credential,
    )
    transport.close()


def test_the_relay_refuses_an_expired_credential_and_a_wrong_secret(tmp_path) -> None:
    relay = TurnRelay(tmp_path)
    try:
        fresh = turn_credential(SECRET, "key:fresh", time.time(), 60)
        asyncio.run(_allocate(relay, fresh.username, fresh.credential))
        expired = turn_credential(SECRET, "key:expired", time.time() - 120, 60)
        with pytest.raises(TransactionFailed):
            asyncio.run(_allocate(relay, expired.username, expired.credential))
        forged = turn_credential("not-the-secret", "key:forged", time.time(), 60)
        with pytest.raises(TransactionFailed):
            asyncio.run(_allocate(relay, forged.username, forged.credential))
    finally:
        relay.stop()
    assert relay.allocations() == 1
