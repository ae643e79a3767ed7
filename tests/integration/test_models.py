"""Several models per server: cadenza-tiny, a (tiny, random) Orpheus checkpoint with a SNAC
codec and a (tiny, random) Sesame CSM checkpoint with its Mimi, each in its own engine process,
all served over HTTP, WebSocket and WebRTC, picked by name; unknown models and voices are
refused with what exists; a two-turn CSM conversation over WebSocket reuses the first turn's
KV."""

from __future__ import annotations

import asyncio

import httpx
import numpy as np
import pytest

from cadenza.client.sdk import StreamError, connect
from cadenza.client.webrtc import WebRTCPeer
from tests.integration.server import serving
from tests.unit.engine.csm_checkpoints import save_tiny_csm
from tests.unit.engine.orpheus_checkpoints import save_tiny_orpheus_and_snac

pytest.importorskip("snac")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    orpheus_dir, snac_dir = save_tiny_orpheus_and_snac(root)
    csm_dir = root / "csm"
    save_tiny_csm(csm_dir)
    config = root / "cadenza.toml"
    config.write_text(
        '[[models]]\nname = "cadenza-tiny"\npath = "cadenza-tiny"\n\n'
        f'[[models]]\nname = "orpheus-tiny"\npath = "{orpheus_dir}"\ncodec = "{snac_dir}"\n\n'
        f'[[models]]\nname = "csm-tiny"\npath = "{csm_dir}"\n'
    )
    with serving(root / "server.log", args=("--config", str(config))) as running:
        yield running


def test_models_are_listed_with_their_voices(server) -> None:
    models = httpx.get(f"{server.url}/v1/models").json()["data"]
    assert [m["id"] for m in models] == ["cadenza-tiny", "orpheus-tiny", "csm-tiny"]
    assert "tara" in models[1]["voices"] and models[1]["sample_rate"] == 24000
    assert models[2]["voices"] == ["0", "1"] and models[2]["sample_rate"] == 24000
    ready = httpx.get(f"{server.url}/readyz").json()
    assert {name: model["status"] for name, model in ready["models"].items()} == {
        "cadenza-tiny": "ready",
        "orpheus-tiny": "ready",
        "csm-tiny": "ready",
    }
    capacity = httpx.get(f"{server.url}/v1/capacity").json()
    assert set(capacity["models"]) == {"cadenza-tiny", "orpheus-tiny", "csm-tiny"}
    metrics = httpx.get(f"{server.url}/metrics").text
    assert 'cadenza_kv_pages_total{model="orpheus-tiny",node=' in metrics


VOICE = {"cadenza-tiny": "default", "orpheus-tiny": "tara", "csm-tiny": "1"}


@pytest.mark.parametrize("model", list(VOICE))
def test_http_serves_each_model(server, model) -> None:
    voice = VOICE[model]
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
    async def main() -> tuple[dict, int, int, int, str]:
        async with connect(server.url.replace("http", "ws") + "/v1/stream") as session:
            ready = session.ready
            tiny = [c async for c in session.speak("Hello.", max_duration_s=0.5)]
            orpheus = [
                c
                async for c in session.speak(
                    "Hello.", model="orpheus-tiny", voice="leo", max_duration_s=0.5, top_p=0.9
                )
            ]
            csm = [
                c
                async for c in session.speak(
                    "Hello.", model="csm-tiny", voice="0", format="opus", max_duration_s=0.5
                )
            ]
            with pytest.raises(StreamError) as refused:
                async for _ in session.speak("Hello.", model="nope"):
                    pass
            return ready, len(tiny), len(orpheus), len(csm), refused.value.code

    ready, tiny, orpheus, csm, code = asyncio.run(main())
    assert [m["name"] for m in ready["models"]] == ["cadenza-tiny", "orpheus-tiny", "csm-tiny"]
    assert tiny > 0 and orpheus > 0 and csm > 0 and code == "model_not_found"


@pytest.mark.parametrize(("model", "voice"), [("orpheus-tiny", "zoe"), ("csm-tiny", "0")])
def test_webrtc_picks_the_model_per_speak(server, model, voice) -> None:
    async def main() -> dict:
        peer = WebRTCPeer(server.url)
        try:
            await peer.connect()
            peer.send(
                {"type": "speak", "text": "Hi.", "model": model, "voice": voice,
                 "max_duration_s": 0.5}
            )  # fmt: skip
            return await peer.next_event({"done", "error"}, timeout_s=60)
        finally:
            await peer.close()

    done = asyncio.run(main())
    assert done["type"] == "done", done


def _prefix_hit_tokens(server, model: str) -> float:
    for line in httpx.get(f"{server.url}/metrics").text.splitlines():
        if line.startswith(f'cadenza_prefix_hit_tokens_total{{model="{model}",'):
            return float(line.split()[-1])
    raise AssertionError("no prefix-hit metric")


def test_a_two_turn_csm_conversation_reuses_the_first_turns_kv(server) -> None:
    url = server.url.replace("http", "ws") + "/v1/stream"

    async def main() -> tuple[int, int, dict | None, float, float]:
        async with connect(url) as session:
            pcm = (np.sin(np.arange(12000) / 9.0) * 8000).astype("<i2").tobytes()
            await session.send_microphone(pcm, sample_rate=24000)
            first = [
                c async for c in session.speak(
                    "Hello there.", model="csm-tiny", voice="0", max_duration_s=0.8,
                    conversation=True, use_audio_prompt=True, user_voice="1", user_text="Hi!",
                )
            ]  # fmt: skip
            after_first = session.last_conversation
            await asyncio.sleep(1.0)  # engine stats (prefix hits) reach the edge every 0.5 s
            before = _prefix_hit_tokens(server, "csm-tiny")
            second = [
                c async for c in session.speak(
                    "And goodbye.", model="csm-tiny", voice="0", max_duration_s=0.8,
                    conversation=True,
                )
            ]  # fmt: skip
            after_second = session.last_conversation
            await asyncio.sleep(1.0)
            after = _prefix_hit_tokens(server, "csm-tiny")
            await session.reset_conversation()
            notices = [after_first, after_second, session.last_conversation]
            return len(first), len(second), notices, before, after

    first, second, notices, before, after = asyncio.run(main())
    assert first > 0 and second > 0
    assert [n["turns"] for n in notices] == [2, 3, 0]  # user + model, + model, reset
    # the second prompt is the first prompt, its frames and the user's turn, then new text:
    # everything but the tail of the first turn's last page came from the cache
    assert after - before >= 16


def test_a_csm_text_stream_hears_its_earlier_segments_as_a_conversation_would(server) -> None:
    url = server.url.replace("http", "ws") + "/v1/stream"
    options = {"model": "csm-tiny", "voice": "0", "max_duration_s": 0.8, "temperature": 0}

    async def sentences():
        yield "Hello there."
        await asyncio.sleep(0.3)
        yield " And goodbye."

    async def main() -> tuple[bytes, list[str], bytes]:
        async with connect(url) as session:
            streamed = b"".join(
                [c.data async for c in session.speak_stream(sentences(), **options)]
            )
            segments = list(session.segments)
            said = b""
            for segment in segments:  # each turn hears the one before, as a segment does
                chunks = session.speak(segment, conversation=True, **options)
                said += b"".join([c.data async for c in chunks])
            await session.reset_conversation()
            return streamed, segments, said

    streamed, segments, said = asyncio.run(main())
    assert segments == ["Hello there.", "And goodbye."]
    assert streamed and streamed == said


def test_the_load_tester_targets_a_model_and_its_voices(server, tmp_path) -> None:
    from cadenza.loadtest.harness import LoadTestError, resolve_target, run_loadtest
    from cadenza.loadtest.workload import LoadOptions

    options = LoadOptions(url=server.url, duration_s=1.0, model="csm-tiny")
    assert asyncio.run(resolve_target(options)).voice == "0"  # CSM has no "default" voice
    default = asyncio.run(resolve_target(LoadOptions(url=server.url)))
    assert (default.model, default.voice) == ("cadenza-tiny", "default")
    for bad in ({"model": "nope"}, {"model": "csm-tiny", "voice": "default"}):
        with pytest.raises(LoadTestError, match=r"serves|has"):
            asyncio.run(resolve_target(LoadOptions(url=server.url, **bad)))
    report, _ = asyncio.run(run_loadtest(options, out_dir=tmp_path, concurrency=1))
    (level,) = report["levels"]
    assert level["admitted"] >= 1 and level["errors"] == 0, level["errors_by_reason"]
