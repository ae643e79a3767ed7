"""The utterances a WebSocket or WebRTC session is playing: one asyncio task each, started by
stream id, stopped (cancelled, and waited for) by stream id or all at once, forgotten when they
end by themselves."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

Spawn = Callable[[Coroutine[Any, Any, None]], asyncio.Task[None]]


class UtteranceTasks:
    def __init__(self, spawn: Spawn = asyncio.create_task) -> None:
        self._spawn = spawn
        self._tasks: dict[int, asyncio.Task[None]] = {}

    def __len__(self) -> int:
        return len(self._tasks)

    def start(self, stream_id: int, utterance: Coroutine[Any, Any, None]) -> None:
        task = self._spawn(utterance)
        self._tasks[stream_id] = task
        task.add_done_callback(lambda done: self._forget(stream_id, done))

    async def stop(self, stream_id: int) -> None:
        """Cancel utterance ``stream_id`` and wait until it has let go of everything."""
        task = self._tasks.pop(stream_id, None)
        if task is not None and not task.done():
            task.cancel()
            await asyncio.wait({task})  # a cancel of the caller itself still propagates

    async def stop_all(self) -> None:
        for stream_id in list(self._tasks):
            await self.stop(stream_id)

    def _forget(self, stream_id: int, task: asyncio.Task[None]) -> None:
        if self._tasks.get(stream_id) is task:
            del self._tasks[stream_id]
