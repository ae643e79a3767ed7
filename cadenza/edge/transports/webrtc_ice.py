"""How WebRTC media finds a node that is not directly reachable (a pod, a host behind NAT).

* ``server.webrtc_ice_servers``: STUN/TURN servers the node's own peers gather candidates
  through (aiortc uses the first STUN and the first TURN server), handed to the browser page by
  ``GET /v1/webrtc/config`` so that both ends use the same relay. With a TURN relay (e.g.
  Debian's ``coturn``), a client that may only use relayed candidates still reaches the node.
  A relay configured with a ``secret`` gets credentials that expire
  (:mod:`cadenza.edge.transports.turn_credentials`), made afresh for each answer and each
  peer: the client's for the browser, the node's (``node:<server.node_name>``) for its peers.
* ``server.webrtc_public_address``: the address clients reach this node's media at, for a node
  behind a 1:1 NAT (same ports): the answer's host candidates name it instead of the node's own
  addresses (the way SFUs "announce" an address).

Signalling goes through the front door; the media never does: it flows between the client and
the node that answered its offer (docs/scaling.md).
"""

from __future__ import annotations

import time
from typing import Any

from aiortc import RTCConfiguration, RTCIceServer

from cadenza.config import ServerConfig
from cadenza.config.ice_server import IceServer
from cadenza.edge.transports.turn_credentials import turn_credential


def rtc_configuration(server: ServerConfig, now_s: float | None = None) -> RTCConfiguration:
    """The node's peer connections' configuration (its ICE servers, with credentials for the
    node valid from ``now_s``, default now)."""
    subject = f"node:{server.node_name}"
    return RTCConfiguration(
        iceServers=[RTCIceServer(**entry) for entry in browser_ice_servers(server, subject, now_s)]
    )


def browser_ice_servers(
    server: ServerConfig,
    subject: str,
    now_s: float | None = None,
    not_after: float | None = None,
) -> list[dict[str, Any]]:
    """``RTCIceServer`` dictionaries (``urls``, and ``username``/``credential`` where the
    server has them), as ``GET /v1/webrtc/config`` gives them to ``subject`` (whom the relay
    serves: the client the request is charged to). Fixed credentials go out as configured;
    an entry with a ``secret`` gets a credential valid for ``server.turn_credential_ttl_s``
    from ``now_s`` (default now), and no longer than ``not_after`` (the expiry of the client
    token asking, when it expires sooner). The secret itself is never in them."""
    now = time.time() if now_s is None else now_s
    ttl_s = server.turn_credential_ttl_s
    if not_after is not None:
        ttl_s = max(1, min(ttl_s, int(not_after - now)))
    return [_entry(ice, subject, now, ttl_s) for ice in server.webrtc_ice_servers]


def _entry(ice: IceServer, subject: str, now_s: float, ttl_s: int) -> dict[str, Any]:
    entry: dict[str, Any] = {"urls": list(ice.urls)}
    if ice.secret is not None:
        issued = turn_credential(ice.secret.get_secret_value(), subject, now_s, ttl_s)
        entry.update(username=issued.username, credential=issued.credential)
    else:
        if ice.username is not None:
            entry["username"] = ice.username
        if ice.credential is not None:
            entry["credential"] = ice.credential
    return entry


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
