"""A client token's scope: the models it may open and the audio one stream may play."""

from __future__ import annotations

import dataclasses

import pytest

from cadenza.config import LimitsConfig
from cadenza.contract.request import SynthesisRequest
from cadenza.edge.auth.principal import Principal
from cadenza.edge.streams.errors import EdgeError


def _refusal(call, *args) -> EdgeError:  # type: ignore[no-untyped-def]
    with pytest.raises(EdgeError) as caught:
        call(*args)
    return caught.value


def test_a_token_scope_limits_models_and_audio() -> None:
    limits = LimitsConfig()
    token = Principal(
        kind="client_token", client="key:x", holder="token:y",
        models=frozenset({"a"}), max_audio_s=10.0,
    )  # fmt: skip
    short = SynthesisRequest(request_id="r", text="hi", voice=None)
    assert token.scoped("a", short, limits) == short
    long = dataclasses.replace(short, text="word " * 400)
    assert token.scoped("a", long, limits).max_duration_s == 10.0
    asked = dataclasses.replace(short, max_duration_s=20.0)
    assert _refusal(token.scoped, "a", asked, limits).code == "audio_not_allowed"
    assert _refusal(token.scoped, "b", short, limits).code == "model_not_allowed"
    anyone = Principal.open_server("10.0.0.1")
    assert anyone.scoped("b", asked, limits) == asked


def test_what_each_kind_may_do() -> None:
    key = Principal(kind="stream_key", client="key:a", holder="key:a")
    assert key.may_mint and not key.may_administer
    assert not Principal.open_server("10.0.0.1").may_mint  # tokens would multiply its limits
    assert Principal.open_server("10.0.0.1").client == "ip:10.0.0.1"


def test_an_expired_token_starts_nothing_and_renews_only_as_its_own_client() -> None:
    token = Principal(kind="client_token", client="key:a", holder="token:t", expires_at=100.0)
    token.check_current(now=104.0)  # within the fleet's clock skew
    assert _refusal(token.check_current, 106.0).code == "token_expired"
    fresh = Principal(kind="client_token", client="key:a", holder="token:u", expires_at=999.0)
    assert token.renewed_by(fresh) is fresh
    other = Principal(kind="client_token", client="key:b", holder="token:v")
    assert _refusal(token.renewed_by, other).code == "forbidden"
    key = Principal(kind="stream_key", client="key:a", holder="key:a")
    key.check_current(now=1e12)  # a key does not expire
