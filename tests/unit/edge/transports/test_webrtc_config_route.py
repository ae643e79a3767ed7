"""``GET /v1/webrtc/config``: authenticated like an offer where keys are on, credentials for a
relay with a secret made for the caller, and the secret never in the answer."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from cadenza.config import AuthConfig, CadenzaConfig, ServerConfig
from cadenza.edge.auth.authenticator import Authenticator
from cadenza.edge.server.metrics import Metrics
from cadenza.edge.server.state import EdgeState
from cadenza.edge.streams.errors import install_error_handlers
from cadenza.edge.transports import webrtc_offer
from cadenza.edge.transports.turn_credentials import turn_credential

SECRET = "relay-secret-that-stays-on-the-server"
KEY = "stream-key-for-the-test"
ICE = [
    {"urls": ["turn:relay.example:3478?transport=udp"], "secret": SECRET},
    {"urls": ["turn:fixed.example:3478"], "username": "u", "credential": "p"},
    {"urls": ["stun:stun.example:3478"]},
]


def _client(tmp_path: Path, keys: bool) -> TestClient:
    auth = AuthConfig()
    if keys:
        (tmp_path / "keys").write_text(KEY + "\n")
        auth = AuthConfig(api_keys_file=str(tmp_path / "keys"))
    config = CadenzaConfig(server=ServerConfig(webrtc_ice_servers=ICE), auth=auth)
    app = FastAPI()
    install_error_handlers(app)
    app.include_router(webrtc_offer.router)
    app.state.edge = EdgeState(
        config=config, services={}, metrics=Metrics(), auth=Authenticator.from_config(auth)
    )
    return TestClient(app)


def test_without_a_key_the_config_is_refused_where_keys_are_on(tmp_path: Path) -> None:
    client = _client(tmp_path, keys=True)
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}):
        response = client.get("/v1/webrtc/config", headers=headers)
        assert response.status_code == 401, headers
        assert SECRET not in response.text and "username" not in response.text


def test_a_key_gets_credentials_made_for_it(tmp_path: Path) -> None:
    client = _client(tmp_path, keys=True)
    before = time.time()
    response = client.get("/v1/webrtc/config", headers={"Authorization": f"Bearer {KEY}"})
    assert response.status_code == 200
    assert response.headers["cache-control"] == "no-store"
    assert SECRET not in response.text and "secret" not in response.text
    relayed, fixed, stun = response.json()["ice_servers"]
    expires_at_s, _, subject = relayed["username"].partition(":")
    assert subject.startswith("key:")  # the client the stream is charged to
    assert before + 3600 <= int(expires_at_s) + 1 and int(expires_at_s) <= time.time() + 86400
    issued_at = int(expires_at_s) - 3600
    assert relayed == {
        "urls": ["turn:relay.example:3478?transport=udp"],
        "username": relayed["username"],
        "credential": turn_credential(SECRET, subject, issued_at, 3600).credential,
    }
    assert fixed == ICE[1] and stun == ICE[2]


def test_an_open_server_makes_them_for_the_callers_address(tmp_path: Path) -> None:
    response = _client(tmp_path, keys=False).get("/v1/webrtc/config")
    assert response.status_code == 200
    [relayed, *_] = response.json()["ice_servers"]
    assert relayed["username"].split(":", 1)[1] == "ip:testclient"
    assert SECRET not in response.text


@pytest.mark.parametrize("keys", [True, False])
def test_the_secret_is_in_no_answer(tmp_path: Path, keys: bool) -> None:
    client = _client(tmp_path, keys)
    for headers in ({}, {"Authorization": f"Bearer {KEY}"}):
        assert SECRET not in client.get("/v1/webrtc/config", headers=headers).text
