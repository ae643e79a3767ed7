"""The WebSocket protocol fed bytes from a real client (``websockets``' sans-I/O client), no
socket: a text message that is not UTF-8 closes the connection with 1007 and one WARNING line,
never an ERROR, even when the client's close frame arrives with it; UTF-8 text passes as it is,
fragments joined first."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import pytest
import uvicorn
from uvicorn.server import ServerState
from websockets.client import ClientProtocol
from websockets.http11 import Response
from websockets.uri import parse_uri

from cadenza.edge.transports.ws_protocol import Utf8CheckedWebSocketProtocol


class _Transport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.written = bytearray()
        self.closed = False

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"sockname": ("127.0.0.1", 8000), "peername": ("127.0.0.1", 40000)}.get(
            name, default
        )

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.written += data

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


async def _exchange(send: Callable[[ClientProtocol], None]) -> tuple[ClientProtocol, list[Any]]:
    """Open a connection to an app that records what it receives, let the client ``send``,
    and return the client (with what the server sent it) and the app's messages."""
    received: list[Any] = []

    async def app(scope: Any, receive: Any, asgi_send: Any) -> None:
        assert (await receive())["type"] == "websocket.connect"
        await asgi_send({"type": "websocket.accept"})
        while (message := await receive())["type"] != "websocket.disconnect":
            received.append(message)
        received.append(message)

    # log_config=None: uvicorn's loggers stay as they are, propagating to caplog
    config = uvicorn.Config(app, ws=Utf8CheckedWebSocketProtocol, log_config=None)
    config.load()
    state = ServerState()
    server = Utf8CheckedWebSocketProtocol(config, state, {}, _loop=asyncio.get_running_loop())
    transport = _Transport()
    server.connection_made(transport)
    client = ClientProtocol(parse_uri("ws://127.0.0.1:8000/v1/stream"))
    client.send_request(client.connect())

    async def round_trip() -> None:
        server.data_received(b"".join(client.data_to_send()))
        for _ in range(10):  # the app's task takes its turns
            await asyncio.sleep(0)
        client.receive_data(bytes(transport.written))
        transport.written.clear()

    await round_trip()
    assert isinstance(client.events_received()[0], Response), "no handshake"
    send(client)
    await round_trip()
    server.connection_lost(None)  # the socket closes (the app is told, if it was not yet)
    await asyncio.wait_for(asyncio.gather(*state.tasks), 5)
    return client, received


def _exchanged(send: Callable[[ClientProtocol], None]) -> tuple[ClientProtocol, list[Any]]:
    return asyncio.run(_exchange(send))


def _records_of(caplog: pytest.LogCaptureFixture, level: int) -> list[logging.LogRecord]:
    return [record for record in caplog.records if record.levelno >= level]


def test_utf8_text_reaches_the_app_fragments_joined_first(caplog) -> None:
    def send(client: ClientProtocol) -> None:
        client.send_text('{"a": "é'.encode())
        client.send_text(b'{"price": "\xe2\x82', fin=False)  # the euro sign, split
        client.send_continuation(b'\xac"}', fin=True)

    client, received = _exchanged(send)
    texts = [message.get("text") for message in received[:-1]]
    assert texts == ['{"a": "é', '{"price": "€"}']
    assert client.close_rcvd is None
    assert not _records_of(caplog, logging.WARNING)


@pytest.mark.parametrize(
    "send",
    [
        lambda client: client.send_text(b'{"type": "ping", "data": "\xff"}'),
        lambda client: (
            client.send_text(b'{"data": "\xe2\x82', fin=False),
            client.send_continuation(b'"}', fin=True),
        ),
    ],
    ids=["one frame", "fragments that do not join into UTF-8"],
)
def test_text_that_is_not_utf8_closes_with_1007_and_one_warning(caplog, send) -> None:
    client, received = _exchanged(send)
    warnings = _records_of(caplog, logging.WARNING)
    assert [(r.levelno, r.name) for r in warnings] == [
        (logging.WARNING, "cadenza.edge.transports.ws_protocol")
    ]
    assert warnings[0].exc_info is None and "127.0.0.1:40000" in warnings[0].getMessage()
    reason = "text message is not UTF-8"
    assert client.close_rcvd is not None
    assert (client.close_rcvd.code, client.close_rcvd.reason) == (1007, reason)
    assert received == [{"type": "websocket.disconnect", "code": 1007, "reason": reason}]


def test_text_that_is_not_utf8_with_the_close_frame_behind_it_logs_no_error(caplog) -> None:
    """The close frame is parsed before the text message reaches the protocol: the connection
    is closing already, so no 1007 can be sent (uvicorn's own check raises there, from
    ``data_received``); the client's close is answered."""

    def send(client: ClientProtocol) -> None:
        client.send_text(b"\xff")
        client.send_close(1000)

    client, received = _exchanged(send)
    assert client.close_rcvd is not None and client.close_rcvd.code == 1000
    assert received[-1]["type"] == "websocket.disconnect"
    assert not any(message.get("text") for message in received)
    levels = [record.levelno for record in _records_of(caplog, logging.WARNING)]
    assert levels == [logging.WARNING]


def test_binary_messages_pass_as_they_are(caplog) -> None:
    client, received = _exchanged(lambda client: client.send_binary(b"\xff\xfe"))
    assert received[0] == {"type": "websocket.receive", "bytes": b"\xff\xfe"}
    assert client.close_rcvd is None
    assert not _records_of(caplog, logging.WARNING)
