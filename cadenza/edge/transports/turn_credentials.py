"""TURN credentials that expire, as a relay with a shared secret checks them (the "TURN REST
API" scheme: coturn's ``use-auth-secret`` with ``static-auth-secret``).

The relay and this server share a secret; the server hands each client (and its own peers) a
username that carries an expiry and a password derived from both::

    username   = "<expiry, unix seconds>:<subject>"
    credential = base64(HMAC-SHA1(key=secret, message=username))

The relay recomputes the credential from the username and its copy of the secret, and refuses
every request (allocations, their refreshes, permissions) once the expiry has passed, so a
credential that leaks relays for at most its lifetime. coturn reads the expiry as the digits
before the first ``:``; the subject may contain ``:`` itself (``key:3f2a...``). The subject
names whom the relay serves in its logs and per-user quotas: the client the stream is charged
to (``key:<id>``, ``ip:<address>``), or the node for its own peers.

Pure functions, no I/O: the caller gives the time.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from dataclasses import dataclass

MAX_TTL_S = 86400  # a day: the longest a credential may be valid for


@dataclass(frozen=True)
class TurnCredential:
    """A ``username``/``credential`` pair for ``RTCIceServer``, valid until ``expires_at``
    (unix seconds)."""

    username: str
    credential: str
    expires_at: int


def turn_credential(secret: str, subject: str, now_s: float, ttl_s: int) -> TurnCredential:
    """The credential for ``subject`` valid from ``now_s`` for ``ttl_s`` seconds (1 to
    :data:`MAX_TTL_S`). Raises ``ValueError`` for a lifetime outside that range or an empty
    secret."""
    if not 0 < ttl_s <= MAX_TTL_S:
        raise ValueError(f"a TURN credential lives 1 to {MAX_TTL_S} s, not {ttl_s}")
    if not secret:
        raise ValueError("a TURN credential needs the relay's secret")
    expires_at = int(now_s) + ttl_s
    username = f"{expires_at}:{subject}"
    digest = hmac.new(secret.encode(), username.encode(), hashlib.sha1).digest()
    return TurnCredential(username, base64.b64encode(digest).decode("ascii"), expires_at)
