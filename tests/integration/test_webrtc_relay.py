"""WebRTC through a TURN relay: the server and an aiortc peer that may only use relayed
candidates (as a client behind a strict NAT) reach each other through Debian's coturn on
loopback; the browser page learns the same relay from ``GET /v1/webrtc/config``."""

from __future__ import annotations

import asyncio
import json

import httpx
from aiortc import RTCConfiguration, RTCIceServer, RTCIceTransportPolicy

from cadenza.client.webrtc import WebRTCPeer
from tests.integration.server import serving
from tests.support.turn_process import PASSWORD, USER, TurnRelay


def test_a_relay_only_peer_streams_through_the_turn_server(tmp_path) -> None:
    relay = TurnRelay(tmp_path)
    ice = [{"urls": [relay.url], "username": USER, "credential": PASSWORD}]
    try:
        env = {"CADENZA_SERVER__WEBRTC_ICE_SERVERS": json.dumps(ice)}
        with serving(tmp_path / "server.log", env) as server:
            config = httpx.get(f"{server.url}/v1/webrtc/config", timeout=10).json()
            assert config == {"ice_servers": ice}

            async def main():
                relayed = RTCConfiguration(
                    iceServers=[RTCIceServer(**server_ice) for server_ice in config["ice_servers"]],
                    iceTransportPolicy=RTCIceTransportPolicy.RELAY,
                )
                peer = WebRTCPeer(server.url, configuration=relayed)
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
    assert relay.allocations() >= 1
