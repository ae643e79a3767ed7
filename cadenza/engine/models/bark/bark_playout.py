"""Which Bark streams can skip a step: the ones far enough ahead of their listeners.

A Bark stream's audio comes a fine window at a time (up to 512 frames, 6.8 s), so a stream
that has just delivered one is far ahead of its listener, while a stream still in its semantic
stage has its first audio due. Stepping every stream every step spends the step's time
evenly; resting the streams that are ahead gives it to the ones that are due (and, when every
stream is ahead, leaves the CPU to the rest of the machine).

A stream's listener is taken to start playing when its first audio leaves the engine (the
edge's playout reserve only adds to the lead). A stream rests while its lead exceeds the
reserve plus :data:`SAFETY` times what its next audio needs: the steps
:meth:`~cadenza.engine.models.bark.bark_batch.BarkBatch.steps_to_audio` bounds, each as long as
a step of every live stream (the recent time per advancing stream, times the streams: the
ones resting now will all be stepping then). Streams without audio yet, or whose need is
unknown (semantic stage), never rest.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass

SAFETY = 2.0
"""How many times the estimated time to its next audio a resting stream keeps in hand."""

RECENT_STEPS = 256
"""Steps the recent time per stream is the mean of (a fine window's heavy step counts for its
share, as it does in the steps to the next audio)."""


@dataclass
class _Listener:
    started_at: float
    audio_s: float = 0.0


class BarkPlayout:
    """The listeners' clocks of one engine's streams, and the rest they allow."""

    def __init__(self, reserve_s: float, clock: Callable[[], float]) -> None:
        self.reserve_s = reserve_s
        self.clock = clock
        self._steps: deque[float] = deque(maxlen=RECENT_STEPS)
        self._listeners: dict[int, _Listener] = {}

    @property
    def stream_step_s(self) -> float | None:
        """The recent steps' time per stream they advanced (``None`` before any step)."""
        return sum(self._steps) / len(self._steps) if self._steps else None

    def observe_step(self, seconds: float, streams: int) -> None:
        """A step took ``seconds`` and advanced ``streams`` streams."""
        if streams > 0:
            self._steps.append(seconds / streams)

    def delivered(self, stream_id: int, seconds: float) -> None:
        """``seconds`` more audio of the stream left the engine now."""
        if seconds <= 0:
            return
        listener = self._listeners.get(stream_id)
        if listener is None:
            listener = self._listeners[stream_id] = _Listener(self.clock())
        listener.audio_s += seconds

    def forget(self, stream_id: int) -> None:
        self._listeners.pop(stream_id, None)

    def lead_s(self, stream_id: int) -> float | None:
        """How far the stream's audio is ahead of its listener (``None``: no audio yet)."""
        listener = self._listeners.get(stream_id)
        if listener is None:
            return None
        return listener.audio_s - (self.clock() - listener.started_at)

    def resting(
        self, streams: Iterable[int], steps_to_audio: Callable[[int], int | None]
    ) -> dict[int, float]:
        """The streams among ``streams`` (every live one) that may skip the next step, each
        with how long it could still rest."""
        per_stream_s = self.stream_step_s
        if per_stream_s is None:
            return {}
        live = list(streams)
        step_s = per_stream_s * len(live)
        rest: dict[int, float] = {}
        for stream_id in live:
            lead = self.lead_s(stream_id)
            steps = steps_to_audio(stream_id)
            if lead is None or steps is None:
                continue
            spare = lead - self.reserve_s - SAFETY * steps * step_s
            if spare > 0:
                rest[stream_id] = spare
        return rest
