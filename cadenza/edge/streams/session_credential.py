"""A session's credential renewed while it is open (a ``hello`` after the first), for the
WebSocket and WebRTC alike.

A session is authenticated when it opens; a client token's expiry then bounds when it may
start streams (:meth:`Principal.check_current`), so a long session sends a fresh token of the
same client in a ``hello`` before its own expires. The answer is ``{"type":
"authenticated", "expires_at": <unix seconds, or null for a key>}``; a refused one is an
``error`` with the refusal's code (``invalid_token``, ``token_expired``, ``forbidden`` for
another client's credential, ...), and the session goes on with the credential it had.
"""

from __future__ import annotations

from cadenza.edge.auth.authenticator import Authenticator
from cadenza.edge.auth.principal import Principal
from cadenza.edge.streams import protocol
from cadenza.edge.streams.errors import EdgeError


def renewed(
    auth: Authenticator,
    current: Principal,
    credential: str,
    peer: str | None,
    origin: str | None,
) -> tuple[Principal, str]:
    """The session's credential after a ``hello`` with ``credential`` from ``peer`` (the
    session's ``Origin``: ``origin``), and the message that tells the client."""
    try:
        fresh = current.renewed_by(auth.principal(credential, peer, origin))
    except EdgeError as exc:
        return current, protocol.error_message(exc.code, exc.message)
    expires_at = None if fresh.expires_at is None else int(fresh.expires_at)
    return fresh, protocol.server_message("authenticated", expires_at=expires_at)
