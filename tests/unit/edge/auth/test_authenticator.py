"""One place decides who is calling: admin keys, stream keys, client tokens and the open
server; admin routes take admin keys or a loopback socket peer; failures slow an address."""

from __future__ import annotations

import hashlib
import time

import pytest

from cadenza.edge.auth.api_keys import ApiKeys
from cadenza.edge.auth.auth_failures import AuthFailures
from cadenza.edge.auth.authenticator import Authenticator
from cadenza.edge.auth.client_tokens import ClientTokens, TokenScope
from cadenza.edge.auth.principal import Principal
from cadenza.edge.streams.errors import EdgeError

SECRET = "t" * 40


def _keys(*keys: str) -> ApiKeys:
    return ApiKeys([hashlib.sha256(k.encode()).digest() for k in keys])


def _auth(**kwargs: object) -> Authenticator:
    defaults: dict[str, object] = {
        "api_keys": _keys("stream-key"),
        "admin_keys": _keys("admin-key"),
        "tokens": ClientTokens(SECRET),
    }
    return Authenticator(**{**defaults, **kwargs})  # type: ignore[arg-type]


def _refusal(call, *args) -> EdgeError:  # type: ignore[no-untyped-def]
    with pytest.raises(EdgeError) as caught:
        call(*args)
    return caught.value


def test_keys_and_tokens_become_principals() -> None:
    auth = _auth()
    stream = auth.principal("stream-key", "10.0.0.1")
    admin = auth.principal("admin-key", "10.0.0.1")
    assert stream.kind == "stream_key" and stream.client.startswith("key:")
    assert admin.kind == "admin_key" and admin.may_administer and admin.may_mint
    token, _ = ClientTokens(SECRET).mint(stream, 60, TokenScope())
    held = auth.principal(token, "10.0.0.2")
    assert held.kind == "client_token" and held.client == stream.client  # charged to its minter
    for credential in (None, "", "wrong", "eyJ.x.y"):
        error = _refusal(auth.principal, credential, "10.0.0.3")
        assert error.status == 401 and error.headers["WWW-Authenticate"] == "Bearer"
    assert _refusal(auth.principal, "eyJ.x.y", "10.0.0.4").code == "invalid_token"
    assert _refusal(auth.principal, "wrong", "10.0.0.4").code == "invalid_api_key"


def test_a_token_is_refused_once_its_minting_key_is_gone() -> None:
    before = _auth()
    token, _ = ClientTokens(SECRET).mint(before.principal("stream-key", None), 60, TokenScope())
    after = _auth(api_keys=_keys("replacement-key"))  # the leaked key taken out of the file
    assert _refusal(after.principal, token, "10.0.0.5").code == "invalid_token"
    minted_open, _ = ClientTokens(SECRET).mint(Principal.open_server("x"), 60, TokenScope())
    assert _refusal(before.principal, minted_open, "10.0.0.6").code == "invalid_token"


def test_an_open_server_admits_anyone_but_still_refuses_a_bad_token() -> None:
    auth = _auth(api_keys=None, admin_keys=None)
    assert auth.is_open
    assert auth.principal(None, "10.0.0.1") == Principal.open_server("10.0.0.1")
    assert auth.principal("not-a-token", "10.0.0.1").kind == "open"
    expired, _ = ClientTokens(SECRET).mint(Principal.open_server("x"), 60, TokenScope(), now=0)
    assert _refusal(auth.principal, expired, "10.0.0.1").code == "token_expired"
    scoped, _ = ClientTokens(SECRET).mint(Principal.open_server("x"), 60, TokenScope(models=("a",)))
    assert auth.principal(scoped, "10.0.0.1").models == frozenset({"a"})


def test_a_token_bound_to_an_origin_is_refused_elsewhere() -> None:
    auth = _auth()
    minter = auth.principal("stream-key", None)
    scope = TokenScope(origin="https://app.example.com")
    token, _ = ClientTokens(SECRET).mint(minter, 60, scope)
    for origin in ("https://app.example.com", "HTTPS://App.Example.com:443"):
        assert auth.principal(token, None, origin).origin == "https://app.example.com"
    for origin in (None, "null", "https://evil.example.com", "http://app.example.com",
                   "https://app.example.com:8443", "https://app.example.com.evil.com"):  # fmt: skip
        error = _refusal(auth.principal, token, None, origin)
        assert (error.status, error.code) == (403, "origin_not_allowed")


def test_admin_routes_take_only_admin_keys_when_there_are_some() -> None:
    auth = _auth()
    assert auth.administrator("admin-key", "10.0.0.1", forwarded=True, host="x") is not None
    assert _refusal(auth.administrator, "stream-key", "127.0.0.1", False).status == 403
    token, _ = ClientTokens(SECRET).mint(auth.principal("admin-key", None), 60, TokenScope())
    assert _refusal(auth.administrator, token, "127.0.0.1", False).status == 403
    assert _refusal(auth.administrator, None, "127.0.0.1", False).status == 401


def test_without_admin_keys_only_an_unforwarded_loopback_peer_administers() -> None:
    auth = _auth(admin_keys=None)
    for host in ("127.0.0.1:8000", "localhost", "LOCALHOST:1", "[::1]:8000", "::1"):
        assert auth.administrator(None, "127.0.0.1", False, host) is None
    assert auth.administrator(None, "::1", False, "localhost:8000") is None
    refused = [
        ("127.0.0.1", True, "127.0.0.1:8000", None),  # a proxy forwarded it
        ("10.0.0.1", False, "127.0.0.1:8000", None),  # another host
        (None, False, "127.0.0.1:8000", None),
        ("127.0.0.1", False, "evil.example.com:8000", None),  # a name rebound to 127.0.0.1
        ("127.0.0.1", False, None, None),
        ("127.0.0.1", False, "localhost.evil.com", None),
        ("127.0.0.1", False, "127.0.0.1:8000", "http://127.0.0.1:8000"),  # a web page sent it
    ]
    for peer, forwarded, host, origin in refused:
        error = _refusal(auth.administrator, "stream-key", peer, forwarded, host, origin)
        assert (error.status, error.code) == (403, "forbidden")


def test_failed_attempts_slow_an_address_down_and_only_that_address() -> None:
    auth = _auth(failures=AuthFailures(max_failures=3, window_s=60))
    for _ in range(3):
        assert _refusal(auth.principal, "guess", "10.0.0.9").status == 401
    blocked = _refusal(auth.principal, "stream-key", "10.0.0.9")  # even the right key, for now
    assert (blocked.status, blocked.code) == (429, "too_many_auth_failures")
    assert 1 <= int(blocked.headers["Retry-After"]) <= 60
    assert auth.principal("stream-key", "10.0.0.8").kind == "stream_key"


def test_a_token_lives_no_longer_than_asked() -> None:
    _, expires = ClientTokens(SECRET).mint(Principal.open_server("x"), 1, TokenScope())
    assert expires <= time.time() + 2
