"""What the server lets web pages do: hosts it answers, origins it serves, CORS, page headers.

A browser sends a cross-origin simple ``POST`` (or opens a WebSocket) without asking first, so
a page on any site could drive a server on its visitor's loopback interface unless the server
itself refuses. :class:`BrowserPolicy` runs before every route (it is the outermost
middleware) and applies, in order:

1. hosts: with ``auth.trusted_hosts`` set, a request or WebSocket upgrade whose ``Host`` is not
   listed gets 400 ``invalid_host`` (DNS rebinding,
   :func:`~cadenza.edge.auth.origins.host_trusted`);
2. origins: one whose ``Origin`` is neither the server's own nor in ``auth.allowed_origins``
   gets 403 ``origin_not_allowed`` (:func:`~cadenza.edge.auth.origins.origin_allowed`); a
   WebSocket upgrade is refused with that HTTP response, before any authentication. No
   ``Origin`` (a program) passes;
3. CORS: a preflight (``OPTIONS`` with ``Access-Control-Request-Method``) from an allowed origin
   is answered 204 here; a response to a listed origin carries ``Access-Control-Allow-Origin``
   and exposes the headers a client reads (no credentials: browsers send keys and client tokens
   in ``Authorization``, never cookies);
4. page headers: every HTML document carries a Content-Security-Policy that allows this
   origin's own scripts, styles and connections only (``'self'`` covers ``ws:``/``wss:`` of the
   same host), and may not be framed.

:func:`judge` decides from the request line and headers alone; the middleware only applies it.
"""

from __future__ import annotations

from dataclasses import dataclass

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from cadenza.config.auth import AuthConfig
from cadenza.edge.auth.origins import host_trusted, normalized_origin, origin_allowed
from cadenza.edge.streams.errors import EdgeError, error_response

EXPOSED_HEADERS = "Retry-After, x-cadenza-node, X-Cadenza-Ignored-Fields, Content-Type"
PREFLIGHT_HEADERS = (
    ("Access-Control-Allow-Methods", "GET, POST"),
    ("Access-Control-Allow-Headers", "Authorization, Content-Type"),
    ("Access-Control-Max-Age", "600"),
)
CONTENT_SECURITY_POLICY = (
    "default-src 'self'; connect-src 'self'; object-src 'none'; base-uri 'none'; "
    "form-action 'none'; frame-ancestors 'none'"
)
PAGE_HEADERS = (
    ("Content-Security-Policy", CONTENT_SECURITY_POLICY),
    ("X-Frame-Options", "DENY"),
    ("Referrer-Policy", "no-referrer"),
)
NOSNIFF = ("X-Content-Type-Options", "nosniff")  # on every response


@dataclass(frozen=True)
class Verdict:
    """What to do with one request. ``refusal``: the error to answer instead of the app
    (``None``: let it through); ``preflight``: answer 204 here, with ``headers``; ``headers``:
    added to the response, whoever writes it."""

    refusal: EdgeError | None = None
    preflight: bool = False
    headers: tuple[tuple[str, str], ...] = ()


def judge(
    auth: AuthConfig, *, method: str, origin: str | None, host: str | None, preflight: bool
) -> Verdict:
    """The policy (module docstring, steps 1-3) for a request with this method, ``Origin`` and
    ``Host`` (``None``: the header is absent); ``preflight``: it asks
    ``Access-Control-Request-Method``. A WebSocket upgrade is judged as a ``GET``."""
    if not host_trusted(host, auth.trusted_hosts):
        return Verdict(EdgeError(400, "this server does not answer that Host", code="invalid_host"))
    if not origin_allowed(origin, host, auth.allowed_origins):
        message = "this server does not serve pages of that Origin (auth.allowed_origins)"
        return Verdict(EdgeError(403, message, code="origin_not_allowed"))
    headers: list[tuple[str, str]] = []
    if auth.allowed_origins:  # the answer depends on Origin: caches must not share it
        headers.append(("Vary", "Origin"))
    if origin is None:
        return Verdict(headers=tuple(headers))
    if method == "OPTIONS" and preflight:
        allow = ("Access-Control-Allow-Origin", origin)
        return Verdict(preflight=True, headers=(allow, *PREFLIGHT_HEADERS, *headers))
    if normalized_origin(origin) in auth.allowed_origins:
        headers.append(("Access-Control-Allow-Origin", origin))
        headers.append(("Access-Control-Expose-Headers", EXPOSED_HEADERS))
    return Verdict(headers=tuple(headers))


class BrowserPolicy:
    """The policy of the module docstring, as a plain ASGI middleware (Starlette's
    ``BaseHTTPMiddleware`` would hide client disconnects from the routes)."""

    def __init__(self, app: ASGIApp, auth: AuthConfig) -> None:
        self.app = app
        self.auth = auth

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        request = Headers(scope=scope)
        websocket = scope["type"] == "websocket"
        verdict = judge(
            self.auth,
            method="GET" if websocket else scope["method"],
            origin=request.get("origin"),
            host=request.get("host"),
            preflight="access-control-request-method" in request,
        )
        if verdict.refusal is not None:
            if websocket:
                await _refuse_upgrade(verdict.refusal, scope, receive, send)
            else:
                await error_response(verdict.refusal)(scope, receive, send)
            return
        if websocket:
            await self.app(scope, receive, send)
            return
        added = [(name.encode(), value.encode()) for name, value in (*verdict.headers, NOSNIFF)]
        if verdict.preflight:
            await send({"type": "http.response.start", "status": 204, "headers": added})
            await send({"type": "http.response.body", "body": b""})
            return

        async def send_with_policy(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", ()))
                content_type = Headers(raw=headers).get("content-type", "")
                page = content_type.startswith("text/html")
                page_headers = [(n.encode(), v.encode()) for n, v in PAGE_HEADERS] if page else []
                message = {**message, "headers": [*headers, *added, *page_headers]}
            await send(message)

        await self.app(scope, receive, send_with_policy)


async def _refuse_upgrade(refusal: EdgeError, scope: Scope, receive: Receive, send: Send) -> None:
    """Refuse a WebSocket upgrade with ``refusal`` as its HTTP response where the server offers
    ASGI's denial extension (uvicorn does); else close before accepting, which servers answer
    with a bare 403."""
    connect = await receive()
    if connect["type"] != "websocket.connect":  # the client left already
        return
    if "websocket.http.response" in scope.get("extensions", {}):
        await error_response(refusal)(scope, receive, send)
    else:
        await send({"type": "websocket.close", "code": 1008})
