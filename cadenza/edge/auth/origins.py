"""Web origins and host names: which pages may use the server (``auth.allowed_origins``) and
which names it answers to (``auth.trusted_hosts``).

A browser names the page that opens a WebSocket or sends a cross-origin request in the
``Origin`` header; programs send none. :func:`origin_allowed` is the rule: no ``Origin`` is
allowed (a program, which could forge any header anyway); the same origin is allowed (the
``Origin``'s host and port are the ``Host`` header's: the server's own page); a listed origin
is allowed; any other is not, so a page elsewhere cannot drive the server through its
visitors' browsers. Origins are compared as browsers serialise them: scheme and host in lower
case, the scheme's default port left out.

A page can still reach the server under a name of its own (DNS rebinding: ``evil.example``
resolved to 127.0.0.1), and then it *is* same-origin. :func:`host_trusted` closes that: with
``auth.trusted_hosts`` set, only the listed names are answered.
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit

from cadenza.config.auth import web_origin

# A host name (letters, digits, ``.``, ``-``, ``_``) or a bracketed IPv6 literal, then an
# optional port: what a Host header may hold, in lower case.
_HOST = re.compile(r"(?P<name>[a-z0-9_.-]+|\[[0-9a-f:.]+\])(?::(?P<port>[0-9]{1,5}))?")
_NAME = re.compile(r"[a-z0-9_.-]+|[0-9a-f:.]+")  # an Origin's host as urlsplit gives it


def normalized_origin(header: str | None) -> str | None:
    """``header`` (an ``Origin`` value) as ``scheme://host[:port]``; ``None`` for no header, an
    opaque origin (``null``) or anything that is not an http(s) origin (a path, userinfo, a
    query, a bad port, characters no host name has)."""
    if header is None:
        return None
    try:
        parts = urlsplit(header.strip())
        port = parts.port
    except ValueError:  # a bad port or a broken IPv6 literal
        return None
    if (
        parts.scheme.lower() not in ("http", "https")
        or not parts.hostname
        or not _NAME.fullmatch(parts.hostname)
        or parts.path not in ("", "/")
        or parts.query
        or parts.fragment
        or parts.username is not None
    ):
        return None
    return web_origin(parts.scheme.lower(), parts.hostname, port)


def origin_allowed(origin_header: str | None, host_header: str | None, allowed: list[str]) -> bool:
    """Whether a request with these ``Origin`` and ``Host`` headers may proceed (see the
    module docstring); ``allowed``: ``auth.allowed_origins``, already normalised."""
    if origin_header is None:
        return True
    origin = normalized_origin(origin_header)
    if origin is None:
        return False
    return origin in allowed or same_origin(origin, host_header)


def same_origin(origin: str, host_header: str | None) -> bool:
    """Whether ``origin`` (normalised) names the host and port of ``host_header``, under the
    origin's own scheme (behind a TLS front door the server cannot see the page's scheme)."""
    if not host_header:
        return False
    scheme = origin.split("://", 1)[0]
    return normalized_origin(f"{scheme}://{host_header}") == origin


def split_host(header: str) -> tuple[str, int | None] | None:
    """A ``Host`` header (or a ``trusted_hosts`` entry without its ``*.``) as ``(name,
    port)``: the name in lower case without a trailing dot, an IPv6 literal in brackets (a bare
    one, ``::1``, is taken as a name without port); ``port`` ``None`` where none is written.
    ``None`` for anything that is not a host."""
    value = header.strip().lower()
    if value.count(":") > 1 and not value.startswith("["):
        value = f"[{value}]"
    match = _HOST.fullmatch(value)
    if match is None:
        return None
    name = match["name"].removesuffix(".")
    port = None if match["port"] is None else int(match["port"])
    if not name or name.startswith(".") or (port is not None and port > 65535):
        return None
    return name, port


def host_trusted(host_header: str | None, trusted: list[str]) -> bool:
    """Whether the server answers ``host_header``: always without a ``trusted`` list
    (``auth.trusted_hosts``); else only a listed name. An entry ``name`` matches that name on
    any port, ``name:port`` that port only (as the header writes it: list a bare name for a
    default port), ``*.suffix`` any name under ``suffix`` (not ``suffix`` itself). A missing
    or malformed header matches nothing."""
    if not trusted:
        return True
    host = split_host(host_header) if host_header else None
    if host is None:
        return False
    name, port = host
    for entry in trusted:
        wildcard = entry.startswith("*.")
        pattern = split_host(entry.removeprefix("*."))
        if pattern is None or (pattern[1] is not None and pattern[1] != port):
            continue
        if name.endswith(f".{pattern[0]}") if wildcard else name == pattern[0]:
            return True
    return False
