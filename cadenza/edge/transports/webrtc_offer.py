"""``POST /v1/webrtc/offer`` (a peer connection per offer, its answer back) and
``GET /v1/webrtc/config`` (the ICE servers a browser needs first).

At most ``server.max_pending_webrtc_offers`` peers wait to connect at once, and at most
``server.max_pending_webrtc_offers_per_client`` of one credential (:func:`check_pending_offers`),
so that one client cannot hold every place; an offer that is not
``{"sdp": ..., "type": "offer"}`` or whose SDP aiortc cannot take is refused with 400.
"""

from __future__ import annotations

from collections.abc import Iterable

from aiortc import RTCPeerConnection, RTCSessionDescription
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from cadenza.config import ServerConfig
from cadenza.edge.server.state import EdgeState
from cadenza.edge.streams.errors import EdgeError
from cadenza.edge.streams.untrusted_json import JsonRejected, parse_json
from cadenza.edge.transports.http_io import read_body
from cadenza.edge.transports.webrtc import WebRTCSession
from cadenza.edge.transports.webrtc_ice import (
    announce_address,
    browser_ice_servers,
    rtc_configuration,
)

router = APIRouter()

MAX_SDP_BYTES = 64 * 1024


def parse_offer(raw: bytes) -> RTCSessionDescription:
    """An offer body ``{"sdp": ..., "type": "offer"}``. Raises :class:`EdgeError` 400
    ``invalid_offer``."""
    try:
        body = parse_json(raw)
    except JsonRejected as exc:
        raise EdgeError(400, f"invalid offer: {exc}", code="invalid_offer") from exc
    if not isinstance(body, dict) or body.get("type") != "offer":
        raise EdgeError(
            400, 'invalid offer: body must be {"sdp": ..., "type": "offer"}', code="invalid_offer"
        )
    sdp = body.get("sdp")
    if not isinstance(sdp, str) or not sdp:
        raise EdgeError(400, "invalid offer: sdp must be a non-empty string", code="invalid_offer")
    return RTCSessionDescription(sdp=sdp, type="offer")


def check_pending_offers(pending: Iterable[str], holder: str, server: ServerConfig) -> None:
    """Whether ``holder`` may offer one more peer while the peers of ``pending`` (their
    holders, one per peer waiting to connect) wait. Raises :class:`EdgeError`
    ``too_many_offers``: 429 when the holder has ``server.max_pending_webrtc_offers_per_client``
    waiting (its own doing), 503 when the server has ``server.max_pending_webrtc_offers``; both
    with ``Retry-After`` the connect timeout, by which every pending peer has connected or
    gone."""
    waiting = list(pending)
    per_client = server.max_pending_webrtc_offers_per_client
    if sum(other == holder for other in waiting) >= per_client:
        raise EdgeError(
            429,
            f"this client already has {per_client} WebRTC peer(s) waiting to connect",
            code="too_many_offers",
            retry_after_s=server.webrtc_connect_timeout_s,
        )
    if len(waiting) >= server.max_pending_webrtc_offers:
        raise EdgeError(
            503,
            f"{server.max_pending_webrtc_offers} WebRTC peers are already waiting to connect",
            code="too_many_offers",
            retry_after_s=server.webrtc_connect_timeout_s,
        )


@router.post("/v1/webrtc/offer")
async def webrtc_offer(request: Request) -> dict[str, str]:
    state: EdgeState = request.app.state.edge
    server = state.config.server
    peer = request.client.host if request.client else None
    origin = request.headers.get("origin")
    principal = state.authenticate(request.headers.get("authorization"), peer, origin)
    principal.check_current()  # an expired token opens no session
    state.lifecycle.check_open()  # 503 shutting_down while the server drains
    state.engine_info()  # 503 while the engine is not ready
    raw = await read_body(request, max_bytes=MAX_SDP_BYTES, timeout_s=server.request_body_timeout_s)
    offer = parse_offer(raw)
    pending = (session.principal.holder for session in state.webrtc_sessions if session.pending)
    check_pending_offers(pending, principal.holder, server)
    pc = RTCPeerConnection(rtc_configuration(server))
    session = WebRTCSession(pc, state, principal, peer=peer, origin=origin)
    session.attach()
    state.webrtc_sessions.add(session)
    try:
        await pc.setRemoteDescription(offer)
        await pc.setLocalDescription(await pc.createAnswer())
    except Exception as exc:  # aiortc raises several types for bad SDP
        await session.close()
        raise EdgeError(400, f"invalid SDP: {exc}", code="invalid_sdp") from exc
    answer = announce_address(pc.localDescription.sdp, server.webrtc_public_address)
    return {"sdp": answer, "type": pc.localDescription.type}


@router.get("/v1/webrtc/config")
async def webrtc_config(request: Request) -> JSONResponse:
    """What a browser needs before its offer: the ICE servers (``RTCPeerConnection``'s
    ``iceServers``), so that it relays through the same TURN server as the node. Takes the
    same credential as an offer (401 without one where keys are on): a relay's credentials
    are made for the caller (``principal.client``) and expire; they are not cached
    (``Cache-Control: no-store``)."""
    state: EdgeState = request.app.state.edge
    principal = state.authenticate(
        request.headers.get("authorization"),
        request.client.host if request.client else None,
        request.headers.get("origin"),
    )
    ice_servers = browser_ice_servers(
        state.config.server, principal.client, not_after=principal.expires_at
    )
    return JSONResponse({"ice_servers": ice_servers}, headers={"Cache-Control": "no-store"})
