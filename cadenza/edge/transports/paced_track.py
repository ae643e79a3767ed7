"""A WebRTC peer's outbound audio track: 48 kHz mono in 20 ms frames, each sent at its
wall-clock time from a :class:`JitterBuffer`, with how late each send was."""

from __future__ import annotations

import asyncio
import fractions
import time

import av
import numpy as np
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack

from cadenza.edge.transports.jitter_buffer import FrameKind, JitterBuffer

RTC_RATE = 48000
FRAME_MS = 20


class PacedAudioTrack(MediaStreamTrack):
    """Outbound audio: one 20 ms frame per ``recv`` at its wall-clock time."""

    kind = "audio"

    def __init__(self, buffer: JitterBuffer) -> None:
        super().__init__()
        self.buffer = buffer
        self.frame_samples = buffer.frame_samples
        self._start: float | None = None
        self._sent = 0
        self.send_jitter_ms: list[float] = []  # actual minus scheduled send time
        self.first_audio_at: float | None = None

    async def recv(self) -> av.AudioFrame:
        if self.readyState != "live":
            raise MediaStreamError
        now = time.monotonic()
        if self._start is None:
            self._start = now
        due = self._start + self._sent * FRAME_MS / 1000
        if due > now:
            await asyncio.sleep(due - now)
        self.send_jitter_ms.append(1000 * (time.monotonic() - due))
        if len(self.send_jitter_ms) > 3000:
            del self.send_jitter_ms[:1000]
        samples, kind = self.buffer.pop_frame()
        if kind is FrameKind.AUDIO and self.first_audio_at is None:
            self.first_audio_at = time.monotonic()
        pcm = (np.clip(samples, -1, 1) * 32767).astype("<i2")
        frame = av.AudioFrame.from_ndarray(pcm[None], format="s16", layout="mono")
        frame.sample_rate = RTC_RATE
        frame.pts = self._sent * self.frame_samples
        frame.time_base = fractions.Fraction(1, RTC_RATE)
        self._sent += 1
        return frame
