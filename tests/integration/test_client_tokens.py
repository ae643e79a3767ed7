"""Client tokens against a real server: an app server's key mints them; HTTP, WebSocket
(``hello``) and WebRTC accept them within their scope; they neither mint nor administer;
expired, forged and out-of-scope tokens and garbage mint requests are refused by name."""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import time

import httpx
import pytest
import websockets

from cadenza.client import StreamError, TokenMintError, connect, mint_client_token
from cadenza.client.webrtc import WebRTCPeer
from cadenza.edge.auth.client_tokens import ClientTokens, TokenScope
from cadenza.edge.auth.principal import TOKEN_LEEWAY_S, Principal
from tests.integration.server import serving

KEY = "app-server-key-1"
ADMIN = "admin-key-1"
SECRET = "a-token-secret-of-forty-characters-.....!"
ORIGIN = "https://app.example.com"
MINTER = Principal(
    kind="stream_key",
    client="key:" + hashlib.sha256(KEY.encode()).hexdigest()[:12],
    holder="key:" + hashlib.sha256(KEY.encode()).hexdigest()[:12],
)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    directory = tmp_path_factory.mktemp("tokens")
    (directory / "keys").write_text(f"{KEY}\n")
    (directory / "admin").write_text(f"{ADMIN}\n")
    env = {
        "CADENZA_AUTH__API_KEYS_FILE": str(directory / "keys"),
        "CADENZA_AUTH__ADMIN_KEYS_FILE": str(directory / "admin"),
        "CADENZA_AUTH__TOKEN_SECRET": SECRET,
        "CADENZA_AUTH__ALLOWED_ORIGINS": json.dumps([ORIGIN]),
    }
    with serving(directory / "server.log", env) as running:
        yield running


def _mint(server, credential=KEY, **body):
    headers = {"Authorization": f"Bearer {credential}"} if credential else {}
    return httpx.post(f"{server.url}/v1/client_tokens", json=body, headers=headers, timeout=10)


def _short_lived_token() -> str:
    """A token the server accepts for one to two more seconds, whatever the fraction of the
    current second: it expired its leeway ago, counted from the next whole second (tokens carry
    whole seconds). Mint it just before use; a session sleeping ``SHORT_TOKEN_GONE_S`` outlives
    it."""
    expires = math.ceil(time.time()) + 1 - TOKEN_LEEWAY_S
    token, _ = ClientTokens(SECRET).mint(MINTER, 1, TokenScope(), now=expires - 1)
    return token


SHORT_TOKEN_GONE_S = 2.5


def _speech(server, token, origin=None, **fields):
    headers = {"Authorization": f"Bearer {token}"}
    if origin:
        headers["Origin"] = origin
    body = {"model": "cadenza-tiny", "input": "hi", "response_format": "pcm", **fields}
    return httpx.post(f"{server.url}/v1/audio/speech", json=body, headers=headers, timeout=60)


def _code(response: httpx.Response) -> tuple[int, str]:
    return response.status_code, response.json()["error"]["code"]


def test_a_minted_token_streams_over_http_websocket_and_webrtc(server):
    minted = _mint(server, ttl_s=120, models=["cadenza-tiny"], max_audio_s=30)
    assert minted.status_code == 200 and minted.headers["cache-control"] == "no-store"
    token, expires_at = minted.json()["token"], minted.json()["expires_at"]
    assert isinstance(expires_at, int) and KEY not in token
    assert _speech(server, token).status_code == 200
    models = httpx.get(
        f"{server.url}/v1/models", headers={"Authorization": f"Bearer {token}"}, timeout=10
    )
    assert [m["id"] for m in models.json()["data"]] == ["cadenza-tiny"]
    url = server.url.replace("http", "ws") + "/v1/stream"

    async def over_websocket():
        async with websockets.connect(url) as raw:  # a browser: the token in a first hello
            await raw.send(json.dumps({"type": "hello", "api_key": token}))
            assert json.loads(await raw.recv())["type"] == "ready"
            await raw.send(json.dumps({"type": "speak", "text": "hi", "format": "pcm"}))
            while True:
                message = await raw.recv()
                if isinstance(message, str) and json.loads(message)["type"] in ("done", "error"):
                    return json.loads(message)["type"]

    async def over_webrtc():
        peer = WebRTCPeer(server.url, api_key=token)
        try:
            await peer.connect()
            peer.send({"type": "speak", "text": "hi"})
            return (await peer.next_event({"done", "error"}))["type"]
        finally:
            await peer.close()

    assert asyncio.run(over_websocket()) == "done"
    assert asyncio.run(over_webrtc()) == "done"


def test_a_token_neither_mints_nor_administers(server):
    token = _mint(server).json()["token"]
    assert _code(_mint(server, token)) == (403, "forbidden")
    headers = {"Authorization": f"Bearer {token}"}
    assert _code(httpx.get(f"{server.url}/admin/replicas", headers=headers)) == (403, "forbidden")
    assert _mint(server, ADMIN).status_code == 200  # an admin key mints


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ({"ttl_s": 3601}, (400, "invalid_value")),
        ({"ttl_s": 0}, (400, "invalid_value")),
        ({"ttl_s": "soon"}, (400, "invalid_value")),
        ({"models": ["nope"]}, (400, "model_not_found")),
        ({"models": []}, (400, "invalid_value")),
        ({"max_audio_s": -1}, (400, "invalid_value")),
        ({"max_audio_s": 1e9}, (400, "invalid_value")),
        ({"origin": "not an origin"}, (400, "invalid_value")),
        ({"origin": "https://elsewhere.example.com"}, (400, "origin_not_allowed")),
        ({"scope": "all"}, (400, "unknown_field")),
    ],
)
def test_garbage_mint_requests_are_refused_by_name(server, body, expected):
    assert _code(_mint(server, **body)) == expected


def test_garbage_bodies_and_missing_keys_are_refused(server):
    headers = {"Authorization": f"Bearer {KEY}"}
    for raw in (b"[1, 2]", b"{", b'"token"', b"\xff\xfe"):
        refused = httpx.post(f"{server.url}/v1/client_tokens", content=raw, headers=headers)
        assert _code(refused) == (400, "invalid_json")
    assert _code(_mint(server, None)) == (401, "invalid_api_key")
    assert _code(_mint(server, "wrong")) == (401, "invalid_api_key")


def test_expired_forged_and_out_of_scope_tokens_are_refused(server):
    tokens = ClientTokens(SECRET)
    expired, _ = tokens.mint(MINTER, 60, TokenScope(), now=0)
    forged, _ = ClientTokens("another-secret-of-forty-characters-......").mint(
        MINTER, 60, TokenScope()
    )
    elsewhere, _ = tokens.mint(MINTER, 60, TokenScope(models=("another-model",)))
    short, _ = tokens.mint(MINTER, 60, TokenScope(max_audio_s=2.0))
    assert _code(_speech(server, expired)) == (401, "token_expired")
    assert _code(_speech(server, forged)) == (401, "invalid_token")
    assert _code(_speech(server, forged[:-4] + "AAAA")) == (401, "invalid_token")
    assert _code(_speech(server, elsewhere)) == (403, "model_not_allowed")
    assert _code(_speech(server, short, max_duration_s=5)) == (403, "audio_not_allowed")
    assert _speech(server, short, max_duration_s=1.5).status_code == 200
    url = server.url.replace("http", "ws") + "/v1/stream"

    async def hello(token):
        async with websockets.connect(url) as raw:
            await raw.send(json.dumps({"type": "hello", "api_key": token}))
            return json.loads(await raw.recv())["code"]

    assert asyncio.run(hello(expired)) == "token_expired"
    assert asyncio.run(hello(forged)) == "invalid_token"


def test_a_token_bound_to_an_origin_works_only_from_there(server):
    token = _mint(server, origin=ORIGIN.upper() + ":443").json()["token"]
    assert _speech(server, token, origin=ORIGIN).status_code == 200
    assert _code(_speech(server, token)) == (403, "origin_not_allowed")  # no Origin: not a page
    assert _speech(server, token, origin="https://evil.example.com").status_code == 403


def test_the_sdk_mints_for_an_app_server_and_streams_with_the_token(server):
    token = mint_client_token(server.url, KEY, ttl_s=60, models=["cadenza-tiny"])
    assert token.expires_at > 0
    url = server.url.replace("http", "ws") + "/v1/stream"

    async def main():
        async with connect(url, api_key=token.token) as session:
            return [chunk async for chunk in session.speak("hi", format="pcm")]

    assert asyncio.run(main())
    with pytest.raises(TokenMintError) as refused:
        mint_client_token(server.url, token.token)
    assert (refused.value.status, refused.value.code) == (403, "forbidden")
    with pytest.raises(TokenMintError) as refused:
        mint_client_token(server.url, KEY, ttl_s=1e6)
    assert (refused.value.status, refused.value.code) == (400, "invalid_value")


def test_a_session_outliving_its_token_renews_it_with_a_hello(server):
    fresh = _mint(server, ttl_s=60).json()["token"]
    foreign = _mint(server, ADMIN, ttl_s=60).json()["token"]  # another key's: another client
    url = server.url.replace("http", "ws") + "/v1/stream"

    async def main():
        async with websockets.connect(url) as raw:
            await raw.send(json.dumps({"type": "hello", "api_key": _short_lived_token()}))
            assert json.loads(await raw.recv())["type"] == "ready"
            await asyncio.sleep(SHORT_TOKEN_GONE_S)
            await raw.send(json.dumps({"type": "speak", "text": "hi", "format": "pcm"}))
            expired = json.loads(await raw.recv())
            await raw.send(json.dumps({"type": "hello", "api_key": foreign}))
            other = json.loads(await raw.recv())
            await raw.send(json.dumps({"type": "hello", "api_key": "eyJ.forged.token"}))
            forged = json.loads(await raw.recv())
            await raw.send(json.dumps({"type": "hello", "api_key": fresh}))
            renewed = json.loads(await raw.recv())
            await raw.send(json.dumps({"type": "speak", "text": "hi", "format": "pcm"}))
            while True:
                message = await raw.recv()
                if isinstance(message, str) and json.loads(message)["type"] in ("done", "error"):
                    return expired, other, forged, renewed, json.loads(message)

    expired, other, forged, renewed, last = asyncio.run(main())
    assert (expired["type"], expired["code"]) == ("error", "token_expired")
    assert (other["type"], other["code"]) == ("error", "forbidden")
    assert (forged["type"], forged["code"]) == ("error", "invalid_token")
    assert renewed["type"] == "authenticated" and renewed["expires_at"] > time.time()
    assert last["type"] == "done"


def test_an_expired_token_opens_no_webrtc_session_and_its_relay_expires_with_it(server):
    expired, _ = ClientTokens(SECRET).mint(MINTER, 1, TokenScope(), now=time.time() - 60)
    headers = {"Authorization": f"Bearer {expired}"}
    offer = httpx.post(f"{server.url}/v1/webrtc/offer", json={}, headers=headers)
    assert _code(offer) == (401, "token_expired")


def test_the_sdk_renews_a_sessions_token(server):
    fresh = mint_client_token(server.url, KEY, ttl_s=60)
    foreign = mint_client_token(server.url, ADMIN, ttl_s=60)
    url = server.url.replace("http", "ws") + "/v1/stream"

    async def main():
        async with connect(url, api_key=_short_lived_token()) as session:
            await asyncio.sleep(SHORT_TOKEN_GONE_S)
            with pytest.raises(StreamError) as expired:
                async for _ in session.speak("hi", format="pcm"):
                    pass
            with pytest.raises(StreamError) as other:
                await session.renew(foreign.token)
            expires_at = await session.renew(fresh.token)
            chunks = [c async for c in session.speak("hi", format="pcm")]
            return expired.value.code, other.value.code, expires_at, chunks

    expired, other, expires_at, chunks = asyncio.run(main())
    assert (expired, other) == ("token_expired", "forbidden")
    assert expires_at == fresh.expires_at and chunks
