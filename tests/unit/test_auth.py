"""``[auth]``: a token secret long enough, origins as browsers spell them, host names; garbage
refused with the key named; and none of it handed to an engine process."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from cadenza.config import AuthConfig, CadenzaConfig, load_config


def test_origins_are_kept_as_browsers_serialise_them() -> None:
    auth = AuthConfig(
        allowed_origins=[
            "HTTPS://App.Example.com", "https://app.example.com:443/", "http://localhost:8000",
            "http://[::1]:80", "https://xn--bcher-kva.example",
        ]
    )  # fmt: skip
    assert auth.allowed_origins == [
        "https://app.example.com", "https://app.example.com", "http://localhost:8000",
        "http://[::1]", "https://xn--bcher-kva.example",
    ]  # fmt: skip


@pytest.mark.parametrize(
    "origin",
    ["app.example.com", "ftp://app.example.com", "https://", "https://app.example.com/path",
     "https://user@app.example.com", "https://app.example.com?x=1", "https://a.com:99999",
     "null", "*", ""],
)  # fmt: skip
def test_anything_but_an_origin_is_refused(origin: str) -> None:
    with pytest.raises(ValidationError, match="allowed_origins"):
        AuthConfig(allowed_origins=[origin])


@pytest.mark.parametrize("host", ["", "a b", "*.", "a/b", "user@host", "*"])
def test_bad_trusted_hosts_are_refused(host: str) -> None:
    with pytest.raises(ValidationError, match="trusted_hosts"):
        AuthConfig(trusted_hosts=[host])


def test_a_short_token_secret_is_refused_and_a_long_one_never_shown() -> None:
    with pytest.raises(ValidationError, match="at least 32"):
        AuthConfig(token_secret="short")  # type: ignore[arg-type]
    secret = "k" * 40
    auth = AuthConfig(token_secret=secret)  # type: ignore[arg-type]
    assert secret not in repr(auth) and secret not in auth.model_dump_json()


def test_the_engine_is_handed_no_secret(monkeypatch) -> None:
    monkeypatch.setenv("CADENZA_AUTH__TOKEN_SECRET", "s" * 40)
    monkeypatch.setenv("CADENZA_LIMITS__REDIS_URL", "redis://:hunter2@redis:6379/0")
    monkeypatch.setenv(
        "CADENZA_SERVER__WEBRTC_ICE_SERVERS",
        json.dumps([{"urls": ["turn:turn.example.com:3478"], "secret": "turn-secret"}]),
    )
    config = load_config()
    handed = json.dumps(config.without_secrets().model_dump(mode="json"))
    for secret in ("s" * 40, "hunter2", "turn-secret", "**********"):
        assert secret not in handed
    assert CadenzaConfig.model_validate_json(handed).auth == AuthConfig()
