"""With a key file, HTTP, WebSocket and WebRTC refuse missing and wrong keys and accept the
right one (header, or a first ``hello`` message for browsers); admin routes take only admin
keys, or on a server without them only an unforwarded loopback peer."""

from __future__ import annotations

import asyncio
import hashlib
import json

import httpx
import pytest
import websockets

from cadenza.client import StreamError, connect
from cadenza.client.webrtc import WebRTCPeer
from tests.integration.server import serving

KEY = "test-key-123"
OTHER = "hashed-key-456"
ADMIN = "admin-key-789"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    directory = tmp_path_factory.mktemp("keys")
    keys = directory / "keys.txt"
    keys.write_text(f"# keys\n{KEY}\nsha256:{hashlib.sha256(OTHER.encode()).hexdigest()}\n")
    admin_keys = directory / "admin-keys.txt"
    admin_keys.write_text(f"{ADMIN}\n")
    env = {
        "CADENZA_AUTH__API_KEYS_FILE": str(keys),
        "CADENZA_AUTH__ADMIN_KEYS_FILE": str(admin_keys),
    }
    with serving(directory / "server.log", env) as running:
        yield running


def _speech(server, key):
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    body = {"model": "cadenza-tiny", "input": "hi", "response_format": "pcm"}
    return httpx.post(f"{server.url}/v1/audio/speech", json=body, headers=headers, timeout=60)


def test_http_refuses_missing_and_wrong_keys(server):
    for key in (None, "wrong"):
        response = _speech(server, key)
        assert response.status_code == 401
        assert response.headers["www-authenticate"] == "Bearer"
        error = response.json()["error"]
        assert (error["code"], error["type"]) == ("invalid_api_key", "authentication_error")
    assert _speech(server, KEY).status_code == 200
    assert _speech(server, OTHER).status_code == 200  # listed by hash only
    assert httpx.get(f"{server.url}/v1/models").status_code == 401
    assert httpx.get(f"{server.url}/healthz").status_code == 200  # probes stay open


def test_websocket_header_and_hello(server):
    url = server.url.replace("http", "ws") + "/v1/stream"

    async def main():
        async with connect(url, api_key=KEY) as session:
            assert [c async for c in session.speak("hi")]
        async with websockets.connect(url) as raw:  # a browser: no headers, a hello first
            await raw.send(json.dumps({"type": "hello", "api_key": OTHER}))
            assert json.loads(await raw.recv())["type"] == "ready"
        for first in ({"type": "hello", "api_key": "wrong"}, {"type": "speak", "text": "hi"}):
            async with websockets.connect(url) as raw:
                await raw.send(json.dumps(first))
                assert json.loads(await raw.recv())["code"] == "invalid_api_key"
                with pytest.raises(websockets.ConnectionClosed) as closed:
                    await raw.recv()
                assert closed.value.rcvd.code == 4003
        with pytest.raises(StreamError) as caught:
            async with connect(url, api_key="wrong"):
                pass
        assert caught.value.code == "invalid_api_key"

    asyncio.run(main())


def test_webrtc_offer_needs_the_key(server):
    response = httpx.post(f"{server.url}/v1/webrtc/offer", json={"sdp": "v=0", "type": "offer"})
    assert response.status_code == 401

    async def main():
        peer = WebRTCPeer(server.url, api_key=KEY)
        try:
            await peer.connect()
            peer.send({"type": "speak", "text": "hi"})
            return (await peer.next_event({"done", "error"}))["type"]
        finally:
            await peer.close()

    assert asyncio.run(main()) == "done"


@pytest.fixture(scope="module")
def limited_server(tmp_path_factory):
    env = {"CADENZA_LIMITS__REQUESTS_PER_MINUTE": "2"}
    with serving(tmp_path_factory.mktemp("limits") / "server.log", env) as running:
        yield running


def test_rate_limits_answer_429_with_retry_after(limited_server):
    assert [_speech(limited_server, None).status_code for _ in range(2)] == [200, 200]
    refused = _speech(limited_server, None)
    assert refused.status_code == 429
    assert refused.json()["error"]["code"] == "rate_limited"
    assert 1 <= int(refused.headers["retry-after"]) <= 30
    url = limited_server.url.replace("http", "ws") + "/v1/stream"

    async def main():
        async with websockets.connect(url) as raw:
            await raw.recv()
            await raw.send(json.dumps({"type": "speak", "text": "hi"}))
            return json.loads(await raw.recv())

    error = asyncio.run(main())  # the same client (this address) over WebSocket
    assert error["code"] == "rate_limited" and error["retry_after_s"] > 0


@pytest.fixture(scope="module")
def guarded_server(tmp_path_factory):
    directory = tmp_path_factory.mktemp("guard")
    phrases = directory / "phrases.txt"
    phrases.write_text("forbidden words\n")
    env = {"CADENZA_GUARD__POLICY": "phrase_list", "CADENZA_GUARD__PHRASES_FILE": str(phrases)}
    with serving(directory / "server.log", env) as running:
        yield running


def test_the_guard_refuses_on_every_transport(guarded_server):
    body = {"model": "cadenza-tiny", "input": "say the Forbidden words", "response_format": "pcm"}
    refused = httpx.post(f"{guarded_server.url}/v1/audio/speech", json=body, timeout=60)
    assert refused.status_code == 400 and refused.json()["error"]["code"] == "content_refused"
    body["input"] = "harmless"
    assert (
        httpx.post(f"{guarded_server.url}/v1/audio/speech", json=body, timeout=60).status_code
        == 200
    )
    url = guarded_server.url.replace("http", "ws") + "/v1/stream"

    async def main():
        async with connect(url) as session:
            with pytest.raises(StreamError) as caught:
                async for _ in session.speak("forbidden words"):
                    pass
            return caught.value.code

    assert asyncio.run(main()) == "content_refused"
    audit = [
        line for line in guarded_server.log_path.read_text().splitlines() if "cadenza.audit" in line
    ]
    decisions = [json.loads(json.loads(line)["msg"])["allowed"] for line in audit]
    assert decisions == [False, True, False]  # one audit line per decision


def test_admin_routes_need_an_admin_key(server):
    for key in (None, "wrong"):
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        response = httpx.get(f"{server.url}/admin/replicas", headers=headers, timeout=10)
        assert response.status_code == 401
        assert response.json()["error"]["code"] == "invalid_api_key"
    for key in (KEY, OTHER):  # a stream key, even from this host's loopback interface
        headers = {"Authorization": f"Bearer {key}"}
        response = httpx.post(f"{server.url}/admin/drain", headers=headers, timeout=10)
        assert response.status_code == 403 and response.json()["error"]["code"] == "forbidden"
    headers = {"Authorization": f"Bearer {ADMIN}"}
    listed = httpx.get(f"{server.url}/admin/replicas", headers=headers, timeout=10).json()
    (replica,) = listed["models"]["cadenza-tiny"]
    assert replica["status"] == "ready" and replica["pid"] > 0
    assert _speech(server, ADMIN).status_code == 200  # an admin key streams too


def test_without_admin_keys_a_forwarded_request_is_not_local(limited_server):
    url = f"{limited_server.url}/admin/replicas"
    assert httpx.get(url, timeout=10).status_code == 200  # this host's loopback interface
    for header in ("X-Forwarded-For", "Forwarded", "X-Real-IP"):
        forged = httpx.get(url, headers={header: "127.0.0.1"}, timeout=10)
        assert forged.status_code == 403 and forged.json()["error"]["code"] == "forbidden"
