"""Client tokens: minted scoped and signed, verified statelessly by any holder of the secret;
expired, forged, altered, malformed and foreign tokens refused with the right code."""

from __future__ import annotations

import base64
import json
import time

import jwt
import pytest

from cadenza.edge.auth.client_tokens import (
    ClientTokens,
    TokenRefused,
    TokenScope,
    looks_like_token,
)
from cadenza.edge.auth.principal import Principal
from cadenza.edge.auth.secret_keys import derived_key

SECRET = "s" * 40
MINTER = Principal(kind="stream_key", client="key:0123456789ab", holder="key:0123456789ab")


def test_a_token_carries_its_minter_and_scope_to_another_node() -> None:
    scope = TokenScope(models=("orpheus",), max_audio_s=30.0, origin="https://app.example.com")
    token, expires_at = ClientTokens(SECRET).mint(MINTER, 60, scope)
    assert looks_like_token(token) and abs(expires_at - (time.time() + 60)) < 3
    principal = ClientTokens(SECRET).verify(token)  # another node, the same secret
    assert principal.kind == "client_token" and principal.client == MINTER.client
    assert principal.holder.startswith("token:") and principal.holder != MINTER.holder
    assert principal.models == frozenset({"orpheus"}) and principal.max_audio_s == 30.0
    assert principal.origin == "https://app.example.com" and principal.expires_at == expires_at
    assert not principal.may_mint and not principal.may_administer
    unscoped = ClientTokens(SECRET).verify(ClientTokens(SECRET).mint(MINTER, 60, TokenScope())[0])
    assert unscoped.models is None and unscoped.max_audio_s is None and unscoped.origin is None


def test_two_tokens_of_one_minter_are_two_holders() -> None:
    tokens = ClientTokens(SECRET)
    first = tokens.verify(tokens.mint(MINTER, 60, TokenScope())[0])
    second = tokens.verify(tokens.mint(MINTER, 60, TokenScope())[0])
    assert first.client == second.client and first.holder != second.holder


def test_an_expired_token_is_refused_as_expired() -> None:
    tokens = ClientTokens(SECRET)
    token, _ = tokens.mint(MINTER, 60, TokenScope(), now=time.time() - 120)
    with pytest.raises(TokenRefused) as refused:
        tokens.verify(token)
    assert refused.value.code == "token_expired"


def _claims(**changes: object) -> dict[str, object]:
    now = int(time.time())
    claims: dict[str, object] = {
        "iss": "cadenza", "aud": "cadenza:stream", "sub": "key:x", "jti": "abc",
        "iat": now, "exp": now + 86400,  # built at collection: valid however late the test runs
    }  # fmt: skip
    claims.update(changes)
    return {k: v for k, v in claims.items() if v is not None}


def _signed(claims: dict[str, object], key: bytes | str | None = None, alg: str = "HS256") -> str:
    return jwt.encode(claims, key or derived_key(SECRET, "client-tokens"), algorithm=alg)


@pytest.mark.parametrize(
    "token",
    [
        pytest.param(_signed(_claims(), key=derived_key("o" * 40, "client-tokens")), id="forged"),
        pytest.param(_signed(_claims(), key=SECRET.encode()), id="raw-secret-not-derived-key"),
        pytest.param(_signed(_claims(aud="other")), id="other-audience"),
        pytest.param(_signed(_claims(iss="other")), id="other-issuer"),
        pytest.param(_signed(_claims(jti=None)), id="no-id"),
        pytest.param(_signed(_claims(exp=None)), id="no-expiry"),
        pytest.param(_signed(_claims(models="orpheus")), id="models-not-a-list"),
        pytest.param(_signed(_claims(max_audio_s="lots")), id="audio-not-a-number"),
        pytest.param(_signed(_claims(sub=7)), id="subject-not-a-string"),
        pytest.param(_signed(_claims(), key=derived_key(SECRET, "client-tokens"), alg="HS512"),
                     id="other-algorithm"),
        pytest.param("eyJhbGciOiJub25lIn0." + base64.urlsafe_b64encode(
            json.dumps(_claims()).encode()).decode().rstrip("=") + ".", id="alg-none"),
        pytest.param("eyJ.garbage.here", id="garbage"),
        pytest.param("eyJ" + "a" * 5000 + ".b.c", id="too-long"),
    ],
)  # fmt: skip
def test_bad_tokens_are_refused_as_invalid(token: str) -> None:
    with pytest.raises(TokenRefused) as refused:
        ClientTokens(SECRET).verify(token)
    assert refused.value.code == "invalid_token"


def test_an_altered_token_is_refused() -> None:
    token, _ = ClientTokens(SECRET).mint(MINTER, 60, TokenScope(models=("a",)))
    header, payload, signature = token.split(".")
    claims = json.loads(base64.urlsafe_b64decode(payload + "=="))
    claims["models"] = ["a", "b"]
    widened = base64.urlsafe_b64encode(json.dumps(claims).encode()).decode().rstrip("=")
    with pytest.raises(TokenRefused) as refused:
        ClientTokens(SECRET).verify(f"{header}.{widened}.{signature}")
    assert refused.value.code == "invalid_token"


def test_only_jwt_shaped_credentials_are_read_as_tokens() -> None:
    assert not looks_like_token("sk-live-1234")
    assert not looks_like_token("a.b.c")
    assert not looks_like_token("")
