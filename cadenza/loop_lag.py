"""How late an asyncio event loop runs what is due: the stalls a real-time process cannot see
from inside its own callbacks.

A stream's audio crosses two event loops after the engine: the edge's (engine output in,
WebSocket, HTTP or WebRTC out) and, in a load test, the load tester's (every client's reads and
its simulated playout). While either loop is blocked (a long synchronous call, a collection,
the process preempted), no chunk moves, and a listener whose buffer is shorter than the stall
hears a gap that the engine's deadline accounting never sees: the engine delivered on time.

:class:`LoopLagProbe` sleeps ``interval_s`` at a time and records how much later than asked
it woke up. Each lag goes to ``observe`` (the edge feeds a histogram), the longest is kept,
and a lag of ``stall_s`` or more counts as a stall and is logged, so that a gap in the audio
can be laid at the right process's door. With ``watch``, a thread beside the loop also looks
while it is stalled and logs where the loop's thread is (its Python stack) at that moment: what
held the loop, named while it holds it.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import threading
import time
import traceback
from collections.abc import Callable

log = logging.getLogger(__name__)

STALL_S = 0.1  # a loop this late has held every stream's audio for as long as a client buffer
PROBE_INTERVAL_S = 0.05


class LoopLagProbe:
    """Measures the running loop's lateness while :meth:`run` runs (start it as a task).
    ``max_lag_s`` and ``stalls`` cover everything since construction."""

    def __init__(
        self,
        name: str,
        *,
        interval_s: float = PROBE_INTERVAL_S,
        stall_s: float = STALL_S,
        observe: Callable[[float], None] | None = None,
        watch: bool = False,
    ) -> None:
        if interval_s <= 0 or stall_s <= 0:
            raise ValueError("interval_s and stall_s must be positive")
        self.name = name
        self.interval_s = interval_s
        self.stall_s = stall_s
        self.observe = observe
        self.watch = watch
        self.max_lag_s = 0.0
        self.stalls = 0
        self._last_tick = time.monotonic()
        self._named = False  # the current stall's stack has been logged

    def record(self, lag_s: float) -> None:
        """Count one wake-up ``lag_s`` late (what :meth:`run` does after every sleep)."""
        lag_s = max(0.0, lag_s)
        self.max_lag_s = max(self.max_lag_s, lag_s)
        if self.observe is not None:
            self.observe(lag_s)
        if lag_s >= self.stall_s:
            self.stalls += 1
            log.warning("the %s's event loop stalled for %.0f ms", self.name, 1000 * lag_s)

    async def run(self) -> None:
        """Sleep and measure until cancelled (with ``watch``, the watching thread runs as
        long as this does)."""
        loop = asyncio.get_running_loop()
        stop = threading.Event()
        watcher = None
        if self.watch:
            watcher = threading.Thread(
                target=self._watch,
                args=(threading.get_ident(), stop),
                name=f"{self.name}-loop-watch",
                daemon=True,
            )
            watcher.start()
        try:
            while True:
                self._tick()
                due = loop.time() + self.interval_s
                await asyncio.sleep(self.interval_s)
                self.record(loop.time() - due)
        finally:
            stop.set()
            if watcher is not None:
                watcher.join()  # within half an interval

    def _tick(self) -> None:
        self._last_tick = time.monotonic()
        self._named = False

    def _watch(self, loop_thread: int, stop: threading.Event) -> None:
        """Log the loop thread's stack once per stall, while the stall lasts."""
        while not stop.wait(self.interval_s / 2):
            held_s = time.monotonic() - self._last_tick - self.interval_s
            if held_s < self.stall_s or self._named:
                continue
            self._named = True
            frame = sys._current_frames().get(loop_thread)
            stack = "".join(traceback.format_stack(frame, limit=16)) if frame else "(gone)\n"
            log.warning(
                "the %s's event loop has been held for %.0f ms so far, at:\n%s",
                self.name,
                1000 * held_s,
                stack.rstrip(),
            )

    def start(self) -> asyncio.Task[None]:
        """:meth:`run` as a task of the running loop (cancel it to stop)."""
        return asyncio.get_running_loop().create_task(self.run(), name=f"{self.name}-loop-lag")
