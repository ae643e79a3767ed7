"""Several models per server: cadenza-tiny and a (tiny, random) Orpheus checkpoint with a SNAC
codec, each in its own engine process, both served over HTTP, WebSocket and WebRTC, picked by
name; unknown models and voices are refused with what exists."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from cadenza.client.sdk import StreamError, connect
from cadenza.client.webrtc import WebRTCPeer
from tests.integration.server import serving
from tests.unit.engine.orpheus_checkpoints import save_tiny_orpheus_and_snac

pytest.importorskip("snac")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    orpheus_dir, snac_dir = save_tiny_orpheus_and_snac(root)
    config = root / "cadenza.toml"
    config.write_text(
        '[[models]]\nname = "cadenza-tiny"\npath = "cadenza-tiny"\n\n'
        f'[[models]]\nname = "orpheus-tiny"\npath = "{orpheus_dir}"\ncodec = "{snac_dir}"\n'
    )
    with serving(root / "server.log", args=("--config", str(config))) as running:
        yield running


def test_models_are_listed_with_their_voices(server) -> None:
    models = httpx.get(f"{server.url}/v1/models").json()["data"]
    assert [m["id"] for m in models] == ["cadenza-tiny", "orpheus-tiny"]
    assert "tara" in models[1]["voices"] and models[1]["sample_rate"] == 24000
    ready = httpx.get(f"{server.url}/readyz").json()
    assert {name: model["status"] for name, model in ready["models"].items()} == {
        "cadenza-tiny": "ready",
        "orpheus-tiny": "ready",
    }
    capacity = httpx.get(f"{server.url}/v1/capacity").json()
    assert set(capacity["models"]) == {"cadenza-tiny", "orpheus-tiny"}
    metrics = httpx.get(f"{server.url}/metrics").text
    assert 'cadenza_kv_pages_total{model="orpheus-tiny"}' in metrics


@pytest.mark.parametrize("model", ["cadenza-tiny", "orpheus-tiny"])
def test_http_serves_each_model(server, model) -> None:
    voice = "tara" if model == "orpheus-tiny" else "default"
    body = {
        "model": model,
        "input": "Hello.",
        "voice": voice,
        "response_format": "pcm",
        "max_duration_s": 0.5,
        "temperature": 0.0,
    }
    response = httpx.post(f"{server.url}/v1/audio/speech", json=body, timeout=60)
    assert response.status_code == 200, response.text
    assert len(response.content) > 0 and len(response.content) % 2 == 0


def test_unknown_models_and_voices_are_refused_with_what_exists(server) -> None:
    body = {"model": "orpheus-3b", "input": "Hello."}
    response = httpx.post(f"{server.url}/v1/audio/speech", json=body, timeout=30)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "model_not_found" and "'orpheus-tiny'" in error["message"]
    body = {"model": "orpheus-tiny", "input": "Hello.", "voice": "default"}
    response = httpx.post(f"{server.url}/v1/audio/speech", json=body, timeout=30)
    assert response.status_code == 400
    assert "tara, leah" in response.json()["error"]["message"]


def test_websocket_picks_the_model_per_speak(server) -> None:
    async def main() -> tuple[dict, int, int, str]:
        async with connect(server.url.replace("http", "ws") + "/v1/stream") as session:
            ready = session.ready
            tiny = [c async for c in session.speak("Hello.", max_duration_s=0.5)]
            orpheus = [
                c
                async for c in session.speak(
                    "Hello.", model="orpheus-tiny", voice="leo", max_duration_s=0.5, top_p=0.9
                )
            ]
            with pytest.raises(StreamError) as refused:
                async for _ in session.speak("Hello.", model="nope"):
                    pass
            return ready, len(tiny), len(orpheus), refused.value.code

    ready, tiny, orpheus, code = asyncio.run(main())
    assert [m["name"] for m in ready["models"]] == ["cadenza-tiny", "orpheus-tiny"]
    assert tiny > 0 and orpheus > 0 and code == "model_not_found"


def test_webrtc_picks_the_model_per_speak(server) -> None:
    async def main() -> dict:
        peer = WebRTCPeer(server.url)
        try:
            await peer.connect()
            peer.send(
                {"type": "speak", "text": "Hi.", "model": "orpheus-tiny", "voice": "zoe",
                 "max_duration_s": 0.5}
            )  # fmt: skip
            return await peer.next_event({"done", "error"}, timeout_s=60)
        finally:
            await peer.close()

    done = asyncio.run(main())
    assert done["type"] == "done", done
