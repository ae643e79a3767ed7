"""The HTTP server protocol: uvicorn's h11 protocol with a deadline on every request's head and
a bounded socket send buffer.

uvicorn times out idle keep-alive connections, but a client that sends its request line and
headers a byte at a time (slowloris) holds a connection and its memory for as long as it
likes: each byte restarts the keep-alive timer. Here the whole head of each request (the first
on a connection, and each after a response) must arrive within ``server.request_head_timeout_s``;
otherwise the connection is closed and the event logged. Bodies have their own timeout
(:func:`cadenza.edge.transports.http_io.read_body`); WebSocket connections, once upgraded, have the
session's idle timeout.

The kernel's send buffer is fixed at ``server.send_buffer_bytes`` instead of growing to
megabytes: audio needs tens of kilobytes a second, and with a small buffer a client that stops
reading blocks the server's sends within seconds, so ``server.send_timeout_s`` drops it and its
slot is freed, instead of the kernel absorbing minutes of audio first.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from typing import Any

from uvicorn.protocols.http.h11_impl import H11Protocol

log = logging.getLogger(__name__)


class TimedH11Protocol(H11Protocol):
    head_timeout_s = 10.0
    send_buffer_bytes = 0  # 0: the kernel's default (autotuned)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._head_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        sock = transport.get_extra_info("socket")
        if self.send_buffer_bytes and sock is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, self.send_buffer_bytes)
        self._arm_head_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_head_timer()
        super().connection_lost(exc)

    def handle_events(self) -> None:
        before = self.scope
        super().handle_events()
        if self.scope is not before:  # a request head arrived (or an upgrade began)
            self._disarm_head_timer()

    def on_response_complete(self) -> None:
        before = self.scope
        super().on_response_complete()
        if self.scope is before and not self.transport.is_closing():
            self._arm_head_timer()  # the next request on this connection

    def _arm_head_timer(self) -> None:
        self._disarm_head_timer()
        self._head_timer = self.loop.call_later(self.head_timeout_s, self._head_timed_out)

    def _disarm_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if not self.transport.is_closing():
            log.info(
                "closing a connection from %s: no complete request head within %.1f s",
                self.client[0] if self.client else "?",
                self.head_timeout_s,
            )
            self.transport.close()


def timed_h11_protocol(head_timeout_s: float, send_buffer_bytes: int) -> type[TimedH11Protocol]:
    """The protocol class to give uvicorn (``http=``), configured."""
    settings = {"head_timeout_s": head_timeout_s, "send_buffer_bytes": send_buffer_bytes}
    return type("TimedH11Protocol", (TimedH11Protocol,), settings)
