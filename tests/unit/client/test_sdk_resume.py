"""The SDK resumes a dropped utterance even while the lost node still holds it: a resume
refused with ``resume_live`` is asked again until the node lets go (against a scripted
WebSocket server on loopback)."""

from __future__ import annotations

import asyncio
import json

import pytest
import websockets

from cadenza.client import StreamError, connect
from cadenza.client import sdk as sdk_module
from cadenza.edge.streams import protocol

READY = {"type": "ready", "protocol": protocol.PROTOCOL_VERSION, "features": []}


async def _scripted_server(refusals: list[str]) -> tuple[websockets.Server, list[dict]]:
    """A server that starts one utterance, sends one chunk and drops the connection; a resume
    is answered by the next of ``refusals`` (an error code) until none are left, then plays."""
    seen: list[dict] = []

    async def handle(connection: websockets.ServerConnection) -> None:
        await connection.send(json.dumps(READY))
        async for raw in connection:
            message = json.loads(raw)
            seen.append(message)
            if message["type"] == "speak":
                started = {"type": "started", "stream_id": 1, "format": "pcm",
                           "sample_rate": 24000, "resume_token": "tok"}  # fmt: skip
                await connection.send(json.dumps(started))
                await connection.send(protocol.encode_audio_frame(1, 0, b"\x00\x00" * 240))
                await connection.close()
                return
            if message["type"] == "resume":
                if refusals:
                    error = {"type": "error", "code": refusals.pop(0), "message": "not yet"}
                    await connection.send(json.dumps(error))
                    continue
                started = {"type": "started", "stream_id": 2, "format": "pcm",
                           "sample_rate": 24000, "resumed": True}  # fmt: skip
                await connection.send(json.dumps(started))
                await connection.send(protocol.encode_audio_frame(2, 0, b"\x01\x00" * 240))
                await connection.send(json.dumps({"type": "done", "stream_id": 2, "reason": "eos"}))

    server = await websockets.serve(handle, "127.0.0.1", 0)
    return server, seen


def _speak(refusals: list[str]) -> tuple[list[bytes], list[dict], int]:
    async def main():
        server, seen = await _scripted_server(refusals)
        port = server.sockets[0].getsockname()[1]
        try:
            async with connect(f"ws://127.0.0.1:{port}/v1/stream", spill=False) as session:
                chunks = [c.data async for c in session.speak("hi", format="pcm")]
                return chunks, seen, session.resumes
        finally:
            server.close()
            await server.wait_closed()

    return asyncio.run(main())


def test_a_resume_refused_as_live_is_asked_again_until_it_goes_through(monkeypatch) -> None:
    monkeypatch.setattr(sdk_module, "RESUME_LIVE_RETRY_S", 0.05)
    chunks, seen, resumes = _speak(["resume_live", "resume_live"])
    assert [m["type"] for m in seen] == ["speak", "resume", "resume", "resume"]
    assert chunks == [b"\x00\x00" * 240, b"\x01\x00" * 240] and resumes == 1


def test_any_other_refusal_ends_the_utterance(monkeypatch) -> None:
    monkeypatch.setattr(sdk_module, "RESUME_LIVE_RETRY_S", 0.05)
    with pytest.raises(StreamError) as refused:
        _speak(["resume_taken"])
    assert refused.value.code == "resume_taken"
