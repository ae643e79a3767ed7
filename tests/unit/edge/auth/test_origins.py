"""Which pages and host names the server answers (:mod:`cadenza.edge.auth.origins`): origins
with odd casing, default and other ports, other schemes, ``null``, paths, userinfo, IPv6 and
garbage; ``Host`` headers with ports, suffixes and garbage."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cadenza.edge.auth.origins import host_trusted, normalized_origin, origin_allowed, split_host

APP_ORIGIN = "https://app.example.com"
HOST = "127.0.0.1:8000"


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        ("https://app.example.com", "https://app.example.com"),
        ("HTTPS://App.Example.COM", "https://app.example.com"),
        ("https://app.example.com:443", "https://app.example.com"),
        ("http://app.example.com:80", "http://app.example.com"),
        ("http://app.example.com:443", "http://app.example.com:443"),
        ("https://app.example.com:8443", "https://app.example.com:8443"),
        ("https://app.example.com/", "https://app.example.com"),
        (" https://app.example.com ", "https://app.example.com"),
        ("http://[::1]:8000", "http://[::1]:8000"),
        ("http://[::1]:80", "http://[::1]"),
        ("http://[::1", None),
        ("http://[zz]", None),
        ("null", None),
        ("", None),
        ("file://", None),
        ("ws://app.example.com", None),
        ("chrome-extension://abcdef", None),
        ("https://app.example.com/path", None),
        ("https://app.example.com?q=1", None),
        ("https://app.example.com#x", None),
        ("https://user@app.example.com", None),
        ("https://user:pw@app.example.com", None),
        ("https://app.example.com:99999", None),
        ("https://app.example.com:-1", None),
        ("https://app.example.com:80:80", None),
        ("https://app example.com", None),
        ("https://bücher.example", None),
        ("https://a https://b", None),
        ("\x00\x01garbage", None),
        (None, None),
    ],
)
def test_origins_are_normalised_as_browsers_serialise_them(
    header: str | None, expected: str | None
) -> None:
    assert normalized_origin(header) == expected


@pytest.mark.parametrize(
    ("origin", "host", "allowed", "expected"),
    [
        (None, HOST, [], True),  # a program
        (None, None, [APP_ORIGIN], True),
        ("http://127.0.0.1:8000", HOST, [], True),  # the server's own page
        ("HTTP://127.0.0.1:8000", HOST, [APP_ORIGIN], True),  # its own, with a list
        ("https://localhost", "localhost", [], True),  # behind a TLS front door
        ("https://localhost", "localhost:443", [], True),
        ("http://127.0.0.1:8001", HOST, [], False),  # another port
        ("http://localhost:8000", HOST, [], False),  # another name for the same socket
        ("http://127.0.0.1:8000", None, [], False),
        ("http://127.0.0.1:8000", "", [], False),
        ("https://evil.example", HOST, [], False),
        ("https://evil.example", HOST, [APP_ORIGIN], False),
        (APP_ORIGIN, HOST, [APP_ORIGIN], True),
        ("https://APP.example.com:443", HOST, [APP_ORIGIN], True),
        ("http://app.example.com", HOST, [APP_ORIGIN], False),  # another scheme
        ("https://app.example.com:8443", HOST, [APP_ORIGIN], False),
        ("https://sub.app.example.com", HOST, [APP_ORIGIN], False),
        ("null", HOST, [APP_ORIGIN], False),  # sandboxed frames, file:// pages
        ("null", "null", [], False),
        ("garbage", HOST, [], False),
        ("http://127.0.0.1:8000", "evil.example@127.0.0.1:8000", [], False),
        ("http://[::1]:8000", "[::1]:8000", [], True),
    ],
)
def test_origin_allowed(
    origin: str | None, host: str | None, allowed: list[str], expected: bool
) -> None:
    assert origin_allowed(origin, host, allowed) is expected


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        ("example.com", ("example.com", None)),
        ("Example.COM:8000", ("example.com", 8000)),
        ("example.com.", ("example.com", None)),
        ("[::1]:8000", ("[::1]", 8000)),
        ("[::1]", ("[::1]", None)),
        ("::1", ("[::1]", None)),
        ("127.0.0.1:80", ("127.0.0.1", 80)),
        ("example.com:", None),
        ("example.com:99999", None),
        ("example.com:80:80", None),
        ("user@example.com", None),
        ("example.com/path", None),
        ("exa mple.com", None),
        (".example.com", None),
        ("", None),
        ("[::1", None),
    ],
)
def test_host_headers_split_into_name_and_port(
    header: str, expected: tuple[str, int | None] | None
) -> None:
    assert split_host(header) == expected


TRUSTED = ["localhost", "*.example.com", "api.test:8443", "[::1]"]


@pytest.mark.parametrize(
    ("host", "expected"),
    [
        ("localhost", True),
        ("LOCALHOST:8000", True),  # a name without port matches any port
        ("localhost.", True),
        ("app.example.com", True),
        ("a.b.example.com:9000", True),
        ("example.com", False),  # *.suffix is the names under it, not itself
        ("evilexample.com", False),
        ("example.com.evil.test", False),
        ("api.test:8443", True),
        ("api.test", False),  # name:port is that port only
        ("api.test:443", False),
        ("[::1]:8000", True),
        ("127.0.0.1:8000", False),
        ("evil.test", False),
        ("localhost@evil.test", False),
        ("", False),
        (None, False),
    ],
)
def test_trusted_hosts(host: str | None, expected: bool) -> None:
    assert host_trusted(host, TRUSTED) is expected


def test_without_a_list_every_host_is_answered() -> None:
    assert host_trusted("anything.at.all:1", []) and host_trusted(None, [])


@given(st.text(max_size=80))
def test_garbage_never_raises(header: str) -> None:
    normalized_origin(header)
    origin_allowed(header, header, [APP_ORIGIN])
    host_trusted(header, TRUSTED)
