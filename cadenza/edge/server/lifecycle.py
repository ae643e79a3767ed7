"""Whether the server takes new streams, and the streams it has open: what a drain needs.

Draining (SIGTERM, or ``POST /admin/drain``) is one way: admission refuses every new stream
with 503 ``shutting_down`` (and ``Retry-After``), ``/readyz`` turns 503 so a load balancer
stops sending, and :meth:`Lifecycle.drain` waits for the open streams to end, up to the drain
timeout. Streams still open then are ended with ``shutting_down``: each transport tells its
client so (an ``error`` message, or the end of the HTTP body) instead of cutting it off.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Protocol

from cadenza.contract.errors import ENGINE_RETRY_AFTER_S
from cadenza.edge.streams.errors import EdgeError

log = logging.getLogger(__name__)

# After a drain ends its streams, how long their transports get to send the ``shutting_down``
# and close before the server closes every connection (1012) under them.
CUT_GRACE_S = 2.0


class OpenStream(Protocol):
    def cut(self, reason: str) -> None:
        """End the stream now with ``shutting_down`` (its client is told ``reason``)."""
        ...


class Lifecycle:
    def __init__(self) -> None:
        self.draining = False
        self.drain_started_at: float | None = None
        self._streams: set[OpenStream] = set()
        self._changed = asyncio.Event()
        # Called once as the drain begins (this node gives up its share of the host's cores:
        # a node started in its place takes the whole host, not what is left beside it).
        self.on_drain: list[Callable[[], None]] = []

    @property
    def open_streams(self) -> int:
        return len(self._streams)

    def check_open(self) -> None:
        """Raises :class:`EdgeError` 503 ``shutting_down`` once the server drains."""
        if self.draining:
            raise EdgeError(
                503,
                "server is shutting down; retry on another instance",
                code="shutting_down",
                retry_after_s=ENGINE_RETRY_AFTER_S,
            )

    def opened(self, stream: OpenStream) -> None:
        self._streams.add(stream)

    def closed(self, stream: OpenStream) -> None:
        self._streams.discard(stream)
        self._changed.set()

    async def drain(self, timeout_s: float) -> int:
        """Stop admitting, wait up to ``timeout_s`` for the open streams to end, then end the
        rest with ``shutting_down`` and give their transports up to :data:`CUT_GRACE_S` to
        tell their clients so (the server closes every connection once this returns).
        Returns how many had to be ended. Idempotent: a second call waits along with the
        first."""
        if not self.draining:
            self.draining = True
            self.drain_started_at = time.monotonic()
            log.info("draining: %d open stream(s), up to %g s", len(self._streams), timeout_s)
            for callback in self.on_drain:
                callback()
        await self._wait_for_streams((self.drain_started_at or time.monotonic()) + timeout_s)
        cut = list(self._streams)
        for stream in cut:
            stream.cut(f"server is shutting down (drain timeout of {timeout_s:g} s)")
        if cut:
            log.warning("drain timeout: ended %d stream(s) with shutting_down", len(cut))
            await self._wait_for_streams(time.monotonic() + CUT_GRACE_S)
        return len(cut)

    async def _wait_for_streams(self, deadline: float) -> None:
        """Until no stream is open, or ``deadline`` (monotonic seconds)."""
        while self._streams:
            left = deadline - time.monotonic()
            if left <= 0:
                return
            self._changed.clear()
            try:
                async with asyncio.timeout(left):
                    await self._changed.wait()
            except TimeoutError:
                return
