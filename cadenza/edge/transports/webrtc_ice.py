"""How WebRTC media finds a node that is not directly reachable (a pod, a host behind NAT).

* ``server.webrtc_ice_servers``: STUN/TURN servers the node's own peers gather candidates
  through (aiortc uses the first STUN and the first TURN server), handed to the browser page by
  ``GET /v1/webrtc/config`` so that both ends use the same relay. With a TURN relay (e.g.
  Debian's ``coturn``), a client that may only use relayed candidates still reaches the node.
* ``server.webrtc_public_address``: the address clients reach this node's media at, for a node
  behind a 1:1 NAT (same ports): the answer's host candidates name it instead of the node's own
  addresses (the way SFUs "announce" an address).

Signalling goes through the front door; the media never does: it flows between the client and
the node that answered its offer (docs/scaling.md).
"""

from __future__ import annotations

from typing import Any

from aiortc import RTCConfiguration, RTCIceServer

from cadenza.config import ServerConfig


def rtc_configuration(server: ServerConfig) -> RTCConfiguration:
    """The node's peer connections' configuration (its ICE servers)."""
    return RTCConfiguration(
        iceServers=[
            RTCIceServer(urls=ice.urls, username=ice.username, credential=ice.credential)
            for ice in server.webrtc_ice_servers
        ]
    )


def browser_ice_servers(server: ServerConfig) -> list[dict[str, Any]]:
    """``RTCIceServer`` dictionaries for the browser, as ``GET /v1/webrtc/config`` gives them."""
    return [ice.model_dump(exclude_none=True) for ice in server.webrtc_ice_servers]


def announce_address(sdp: str, address: str | None) -> str:
    """``sdp`` with every host candidate's address (and the connection lines) replaced by
    ``address``; unchanged when ``address`` is ``None``. Relayed and reflexive candidates keep
    theirs."""
    if address is None:
        return sdp
    lines = []
    for line in sdp.split("\r\n"):
        if line.startswith("a=candidate:"):
            fields = line.split(" ")
            if len(fields) > 7 and fields[6:8] == ["typ", "host"]:
                fields[4] = address
                line = " ".join(fields)
        elif line.startswith("c=IN IP4 ") or line.startswith("c=IN IP6 "):
            family = "IP6" if ":" in address else "IP4"
            line = f"c=IN {family} {address}"
        lines.append(line)
    return "\r\n".join(lines)
