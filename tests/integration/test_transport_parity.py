"""HTTP, WebSocket and WebRTC behave the same: the same refusal order and costs (validation,
then the guard, then the rate limit, then capacity), and the same metrics for the same streams
(requests, refusals by code, time to first audio, audio seconds, finished streams)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import httpx
import pytest

from cadenza.client import StreamError, connect
from cadenza.client.webrtc import WebRTCPeer
from tests.integration.server import RunningServer, serving

KEYS = {"http": "key-http", "websocket": "key-websocket", "webrtc": "key-webrtc"}
REQUESTS_PER_MINUTE = 3
FORBIDDEN = "forbidden words"

# What each transport is asked, in order; the code it must answer (None: audio, no error).
SCRIPT: list[tuple[dict[str, str], str | None]] = [
    ({"text": f"say {FORBIDDEN}", "voice": "nobody"}, "voice_not_found"),  # validation first
    *[({"text": f"{FORBIDDEN} {i}"}, "content_refused") for i in range(5)],  # costs nothing
    *[({"text": f"fine {i}"}, None) for i in range(REQUESTS_PER_MINUTE)],
    ({"text": "one too many"}, "rate_limited"),
]

Ask = Callable[[dict[str, str]], Awaitable[str | None]]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    directory = tmp_path_factory.mktemp("parity")
    (directory / "keys.txt").write_text("\n".join(KEYS.values()) + "\n")
    (directory / "phrases.txt").write_text(FORBIDDEN + "\n")
    env = {
        "CADENZA_AUTH__API_KEYS_FILE": str(directory / "keys.txt"),
        "CADENZA_GUARD__POLICY": "phrase_list",
        "CADENZA_GUARD__PHRASES_FILE": str(directory / "phrases.txt"),
        "CADENZA_LIMITS__REQUESTS_PER_MINUTE": str(REQUESTS_PER_MINUTE),
    }
    with serving(directory / "server.log", env) as running:
        yield running


async def _run_script(ask: Ask) -> list[str | None]:
    return [await ask(request) for request, _ in SCRIPT]


async def _over_http(server: RunningServer) -> list[str | None]:
    headers = {"Authorization": f"Bearer {KEYS['http']}"}
    async with httpx.AsyncClient(timeout=60, headers=headers) as client:

        async def ask(request: dict[str, str]) -> str | None:
            body = {"model": "cadenza-tiny", "input": request["text"], "response_format": "pcm"}
            body["voice"] = request.get("voice", "default")
            response = await client.post(f"{server.url}/v1/audio/speech", json=body)
            if response.status_code == 200:
                assert len(response.content) == 2 * 24000  # one second of 16-bit audio
                return None
            return str(response.json()["error"]["code"])

        return await _run_script(ask)


async def _over_websocket(server: RunningServer) -> list[str | None]:
    url = server.url.replace("http", "ws") + "/v1/stream"
    async with connect(url, api_key=KEYS["websocket"]) as session:

        async def ask(request: dict[str, str]) -> str | None:
            try:
                voice = request.get("voice", "default")
                chunks = [c async for c in session.speak(request["text"], voice=voice)]
            except StreamError as exc:
                return exc.code
            assert sum(len(c.data) for c in chunks) == 2 * 24000
            return None

        return await _run_script(ask)


async def _over_webrtc(server: RunningServer) -> list[str | None]:
    peer = WebRTCPeer(server.url, api_key=KEYS["webrtc"])
    try:
        await peer.connect()

        async def ask(request: dict[str, str]) -> str | None:
            peer.send({"type": "speak", **request})
            event = await peer.next_event({"done", "error"}, timeout_s=60)
            if event["type"] == "error":
                return str(event["code"])
            assert event["reason"] == "length"
            return None

        return await _run_script(ask)
    finally:
        await peer.close()


@pytest.mark.parametrize("transport", ["http", "websocket", "webrtc"])
def test_every_transport_refuses_in_the_same_order_at_the_same_cost(server, transport) -> None:
    run = {"http": _over_http, "websocket": _over_websocket, "webrtc": _over_webrtc}[transport]
    answers = asyncio.run(run(server))
    assert answers == [code for _, code in SCRIPT]


def test_every_transport_is_counted_the_same(server) -> None:
    """Runs after the three scripts above (same module, same server)."""

    def value(name: str, **labels: str) -> float:
        rendered = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
        return server.metric(f"{name}{{{rendered}}}")

    seen = {}
    for transport in KEYS:
        seen[transport] = {
            "requests": value("cadenza_stream_requests_total", transport=transport),
            "voice": value(
                "cadenza_stream_refusals_total", code="voice_not_found", transport=transport
            ),
            "guard": value(
                "cadenza_stream_refusals_total", code="content_refused", transport=transport
            ),
            "rate": value(
                "cadenza_stream_refusals_total", code="rate_limited", transport=transport
            ),
            "finished": value(
                "cadenza_streams_finished_total", reason="length", transport=transport
            ),
            "ttfa": value("cadenza_time_to_first_audio_seconds_count", transport=transport),
            "audio_s": value("cadenza_audio_seconds_total", transport=transport),
        }
    expected = {
        "requests": len(SCRIPT),
        "voice": 1,
        "guard": 5,
        "rate": 1,
        "finished": REQUESTS_PER_MINUTE,
        "ttfa": REQUESTS_PER_MINUTE,
        "audio_s": float(REQUESTS_PER_MINUTE),  # one second each, as the engine produced it
    }
    for transport, counts in seen.items():
        counts["audio_s"] = round(counts["audio_s"], 6)
        assert counts == expected, (transport, counts)
