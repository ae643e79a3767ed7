"""The HTTP server process: uvicorn, with SIGTERM (and the first SIGINT) turned into a drain.

On the first SIGTERM or SIGINT the app drains (:meth:`Lifecycle.drain
<cadenza.edge.server.lifecycle.Lifecycle.drain>`: no new streams, ``/readyz`` 503, open streams
run on for up to ``server.drain_timeout_s``, the rest end with ``shutting_down``), then uvicorn
shuts down as usual and the process exits 0. A second signal exits at once. ``POST /admin/drain``
ends the same way. A signal while the engines are still starting (loading, calibrating) stops
them there: the app's start is abandoned (``app.state.abort_start``), every engine started so
far is stopped, and the process exits 0 without serving.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from types import FrameType

import uvicorn
from fastapi import FastAPI

from cadenza.gc_pauses import settle_after_loading

log = logging.getLogger(__name__)


class DrainingServer(uvicorn.Server):
    def __init__(
        self,
        config: uvicorn.Config,
        app: FastAPI,
        drain_timeout_s: float,
        freeze_heap: bool = False,
    ) -> None:
        """Once started (the app's lifespan has started every engine), the process settles
        its heap (:func:`cadenza.gc_pauses.settle_after_loading`; ``freeze_heap``: freeze
        what it has loaded)."""
        super().__init__(config)
        self.app = app
        self.drain_timeout_s = drain_timeout_s
        self.freeze_heap = freeze_heap
        self._loop: asyncio.AbstractEventLoop | None = None
        self._draining: asyncio.Task[None] | None = None
        app.state.exit_after_drain = self._exit

    async def serve(self, sockets: list | None = None) -> None:  # type: ignore[type-arg]
        self._loop = asyncio.get_running_loop()
        await super().serve(sockets)

    async def startup(self, sockets: list | None = None) -> None:  # type: ignore[type-arg]
        await super().startup(sockets)
        if self.started:
            settle_after_loading(self.freeze_heap)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self._loop is None or self._draining is not None or self.should_exit:
            super().handle_exit(sig, frame)  # a second signal: stop now
            return
        if not self.started:  # still starting: nothing to drain, the start is abandoned
            log.info("%s while starting: stopping the engines", signal.Signals(sig).name)
            self.should_exit = True  # serve nothing once the app's start returns
            self.app.state.stop_requested = True
            self._loop.call_soon_threadsafe(self._abort_start)
            return
        log.info("%s: draining before exit", signal.Signals(sig).name)
        self._loop.call_soon_threadsafe(self._start_drain)

    def _abort_start(self) -> None:
        abort = getattr(self.app.state, "abort_start", None)
        if abort is not None:
            abort()

    def _start_drain(self) -> None:
        if self._draining is None:
            self._draining = asyncio.create_task(self._drain_then_exit())

    async def _drain_then_exit(self) -> None:
        state = getattr(self.app.state, "edge", None)
        if state is not None:
            await state.lifecycle.drain(self.drain_timeout_s)
        self._exit()

    def _exit(self) -> None:
        self.should_exit = True
