"""HTTP bodies in and out, bounded in size and in time.

* :func:`read_body` refuses a body over its limit before reading it (``Content-Length``) or as
  soon as it passes the limit, refuses one that stalls (408), and turns a client that hangs up
  mid-body into a quiet 499 instead of an exception.
* :class:`StreamedBody` sends a chunked response whose every send must go through within
  ``send_timeout_s``. However the response ends (finished, a client that stops reading or
  leaves, a send that fails before the first chunk), ``on_close`` runs once: that is where the
  stream behind the body is ended and its slot freed. A client that stopped reading has its
  connection dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping

from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Message, Receive, Scope, Send

from cadenza.edge.streams.errors import EdgeError

log = logging.getLogger(__name__)


async def read_body(request: Request, *, max_bytes: int, timeout_s: float) -> bytes:
    """The whole request body. Raises :class:`EdgeError`: 413 ``body_too_large``, 408
    ``body_timeout``, 499 ``client_closed``."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_bytes:
        raise _too_large(max_bytes)
    body = bytearray()
    while True:
        try:
            async with asyncio.timeout(timeout_s):
                message = await request.receive()
        except TimeoutError:
            raise EdgeError(
                408, f"request body stalled for {timeout_s:g} s", code="body_timeout"
            ) from None
        if message["type"] == "http.disconnect":
            raise EdgeError(499, "the client closed the request", code="client_closed")
        body += message.get("body", b"")
        if len(body) > max_bytes:
            raise _too_large(max_bytes)
        if not message.get("more_body", False):
            return bytes(body)


def _too_large(max_bytes: int) -> EdgeError:
    return EdgeError(413, f"request body exceeds {max_bytes} bytes", code="body_too_large")


class StreamedBody(Response):
    """A 200 response: status, headers, then each chunk of ``chunks`` as it comes."""

    def __init__(
        self,
        chunks: AsyncGenerator[bytes, None],
        *,
        media_type: str,
        headers: Mapping[str, str],
        send_timeout_s: float,
        on_close: Callable[[], Awaitable[None]],
    ) -> None:
        super().__init__(status_code=200, media_type=media_type)
        self.chunks = chunks
        self.on_close = on_close
        self.extra_headers = dict(headers)
        self.send_timeout_s = send_timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        raw_headers = [(b"content-type", str(self.media_type).encode())]
        raw_headers += [(k.lower().encode(), v.encode()) for k, v in self.extra_headers.items()]
        gone = asyncio.ensure_future(_wait_for_disconnect(receive))
        try:
            await self._send(
                send, {"type": "http.response.start", "status": 200, "headers": raw_headers}
            )
            async for chunk in self.chunks:
                if gone.done():
                    log.info("HTTP client left mid-stream; its stream is cancelled")
                    return
                await self._send(
                    send, {"type": "http.response.body", "body": chunk, "more_body": True}
                )
            await self._send(send, {"type": "http.response.body", "body": b"", "more_body": False})
        except EdgeError as exc:  # the status line is gone: an unfinished body says it failed
            log.warning("stream failed after its headers were sent: %s", exc.message)
        except TimeoutError:
            log.warning(
                "dropping an HTTP client that took no data for %.1f s; its stream is cancelled",
                self.send_timeout_s,
            )
        except OSError as exc:
            log.info("HTTP client connection failed mid-stream: %s", exc)
        finally:
            gone.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await gone
            try:
                await self.chunks.aclose()
            finally:
                await self.on_close()

    async def _send(self, send: Send, message: Message) -> None:
        async with asyncio.timeout(self.send_timeout_s):
            await send(message)


async def _wait_for_disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
