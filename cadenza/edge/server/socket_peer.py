"""The socket peer of a request, kept before any proxy header rewrites the client's address.

Behind a front door, ``X-Forwarded-For`` names the client (uvicorn's proxy-headers middleware
rewrites the ASGI scope's ``client`` from it, for the proxies ``server.forwarded_allow_ips``
names), which is right for per-client limits and logs. A decision about the connection itself
(``/admin/*`` answering only this host's loopback interface) must not rest on a header a
client can write: :class:`KeepSocketPeer` runs first and keeps the socket's own address, which
:func:`socket_peer` reads, and :func:`was_forwarded` says whether a proxy forwarded it.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Receive, Scope, Send
from uvicorn.middleware.proxy_headers import ProxyHeadersMiddleware

_KEY = "cadenza.socket_peer"
_FORWARDING = (b"x-forwarded-for", b"forwarded", b"x-real-ip")


class KeepSocketPeer:
    """Keeps the socket peer in the scope, then names the client from ``X-Forwarded-For``
    when the peer is one of ``trusted_proxies``."""

    def __init__(self, app: ASGIApp, trusted_proxies: list[str]) -> None:
        self.app = ProxyHeadersMiddleware(app, trusted_hosts=trusted_proxies)  # type: ignore[arg-type]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] in ("http", "websocket"):
            client = scope.get("client")
            scope[_KEY] = client[0] if client else None
        await self.app(scope, receive, send)  # type: ignore[arg-type]


def socket_peer(scope: Scope) -> str | None:
    """The address of the socket the request came on (``None``: unknown)."""
    peer = scope.get(_KEY)
    if peer is None and _KEY not in scope:  # an app run without the middleware (tests)
        client = scope.get("client")
        return client[0] if client else None
    return peer


def was_forwarded(scope: Scope) -> bool:
    """Whether the request carries a proxy's forwarding header."""
    return any(name in _FORWARDING for name, _ in scope.get("headers", ()))
