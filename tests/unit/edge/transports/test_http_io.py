"""A streamed HTTP body ends its stream exactly once, however the response ends."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator

import pytest
from starlette.types import Message

from cadenza.edge.transports.http_io import StreamedBody


async def _never_disconnects() -> Message:
    await asyncio.sleep(3600)
    return {"type": "http.disconnect"}


def _respond(send_fails_at: int | None) -> tuple[list[str], int]:
    events: list[str] = []
    sends = 0

    async def chunks() -> AsyncGenerator[bytes, None]:
        events.append("started")
        for _ in range(3):
            yield b"x"

    async def on_close() -> None:
        events.append("closed")

    async def send(message: Message) -> None:
        nonlocal sends
        if sends == send_fails_at:
            raise OSError("connection reset")
        sends += 1

    body = StreamedBody(
        chunks(), media_type="audio/wav", headers={}, send_timeout_s=1.0, on_close=on_close
    )
    asyncio.run(body({"type": "http"}, _never_disconnects, send))
    return events, sends


@pytest.mark.parametrize("send_fails_at", [None, 0, 2])
def test_on_close_runs_once_whether_the_body_finished_failed_or_never_started(
    send_fails_at: int | None,
) -> None:
    events, sends = _respond(send_fails_at)
    assert events.count("closed") == 1 and events[-1] == "closed"
    if send_fails_at == 0:
        assert events == ["closed"]  # the status line never went out; nothing was generated
    if send_fails_at is None:
        assert sends == 5  # start, three chunks, the end
