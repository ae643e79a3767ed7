"""A ``hello`` in an open session: a fresh token of the same client renews the session's
credential (``authenticated``); anything else is an ``error`` and the session keeps its own."""

from __future__ import annotations

import hashlib
import json

from cadenza.edge.auth.api_keys import ApiKeys
from cadenza.edge.auth.authenticator import Authenticator
from cadenza.edge.auth.client_tokens import ClientTokens, TokenScope
from cadenza.edge.streams.session_credential import renewed

SECRET = "session-credential-secret-of-40-chars..."


def _auth() -> Authenticator:
    keys = ApiKeys([hashlib.sha256(k.encode()).digest() for k in ("app-key", "other-key")])
    return Authenticator(api_keys=keys, tokens=ClientTokens(SECRET))


def test_a_fresh_token_of_the_same_client_renews_the_session() -> None:
    auth = _auth()
    app = auth.principal("app-key", "10.0.0.1")
    current = auth.principal(ClientTokens(SECRET).mint(app, 60, TokenScope())[0], "10.0.0.1")
    fresh_token, expires_at = ClientTokens(SECRET).mint(app, 600, TokenScope())
    principal, answer = renewed(auth, current, fresh_token, "10.0.0.1", None)
    assert principal.holder != current.holder and principal.client == current.client
    assert json.loads(answer) == {"type": "authenticated", "expires_at": expires_at}
    key_principal, key_answer = renewed(auth, app, "app-key", "10.0.0.1", None)
    assert key_principal == app and json.loads(key_answer)["expires_at"] is None


def test_another_clients_or_a_bad_credential_leaves_the_session_as_it_was() -> None:
    auth = _auth()
    current = auth.principal("app-key", "10.0.0.1")
    other = auth.principal("other-key", "10.0.0.1")
    foreign, _ = ClientTokens(SECRET).mint(other, 60, TokenScope())
    for credential, code in (
        (foreign, "forbidden"),
        ("other-key", "forbidden"),
        ("eyJ.forged.token", "invalid_token"),
        ("wrong", "invalid_api_key"),
        ("", "invalid_api_key"),
    ):
        principal, answer = renewed(auth, current, credential, "10.0.0.2", None)
        assert principal is current
        assert json.loads(answer)["type"] == "error" and json.loads(answer)["code"] == code
