"""A playout jitter buffer: audio arrives in bursts, leaves in 20 ms frames on the clock.

No I/O and no clock of its own: the paced track calls :meth:`pop_frame` every 20 ms. Playback
of an utterance starts once ``reserve_ms`` of audio is buffered (or the utterance ended
shorter), so small delays in generation do not reach the listener. A frame that finds the
buffer empty while the utterance is still coming is an *underrun*: silence goes out and is
counted (consecutive silent frames are one underrun; the longest is kept). A text stream
that waits for its next text :meth:`holds <JitterBuffer.hold>` the buffer: if the audio runs
out while it holds, the silence is the text's (counted as ``text_wait_ms``, no underrun) and
the next audio fills the reserve again before it plays, as a new utterance's does.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import numpy as np


class FrameKind(enum.Enum):
    AUDIO = "audio"  # real audio (the last frame of an utterance may be zero-padded)
    WAITING = "waiting"  # utterance started, filling the reserve: silence
    UNDERRUN = "underrun"  # playing, buffer empty, more audio due: silence
    IDLE = "idle"  # nothing to play: silence


@dataclass
class PlayoutStats:
    underruns: int = 0
    longest_underrun_ms: float = 0.0
    frames_played: int = 0
    text_wait_ms: float = 0.0


class JitterBuffer:
    def __init__(self, sample_rate: int = 48000, frame_ms: int = 20, reserve_ms: int = 100):
        self.sample_rate = sample_rate
        self.frame_samples = sample_rate * frame_ms // 1000
        self.frame_ms = frame_ms
        self.reserve_samples = sample_rate * reserve_ms // 1000
        self._pieces: list[np.ndarray] = []
        self._buffered = 0
        self._active = False  # an utterance is being received or played
        self._playing = False
        self._ended = False
        self._current_underrun_frames = 0
        self._held = False
        self.stats = PlayoutStats()

    @property
    def depth_ms(self) -> float:
        return 1000 * self._buffered / self.sample_rate

    @property
    def active(self) -> bool:
        return self._active

    def start(self) -> None:
        """A new utterance begins (its audio will follow)."""
        self.clear()
        self._active = True
        self.stats = PlayoutStats()

    def push(self, samples: np.ndarray) -> None:
        if self._active and samples.size:
            self._pieces.append(np.asarray(samples, dtype=np.float32))
            self._buffered += samples.size

    def hold(self) -> None:
        """The stream waits for text: running out of audio now is no underrun."""
        self._held = True

    def release(self) -> None:
        """The stream's next text came (its audio follows)."""
        self._held = False

    def end(self) -> None:
        """No more audio for this utterance: play out what is left."""
        self._ended = True

    def clear(self) -> None:
        """Barge-in: drop everything buffered at once."""
        self._pieces, self._buffered = [], 0
        self._active = self._playing = self._ended = self._held = False
        self._current_underrun_frames = 0

    def pop_frame(self) -> tuple[np.ndarray, FrameKind]:
        silence = np.zeros(self.frame_samples, np.float32)
        if not self._active:
            return silence, FrameKind.IDLE
        if self._held and not self._buffered and not self._ended:
            self._playing = False  # the next audio fills the reserve again
            self._current_underrun_frames = 0
            self.stats.text_wait_ms += self.frame_ms
            return silence, FrameKind.WAITING
        if not self._playing:
            if self._buffered >= self.reserve_samples or (self._ended and self._buffered):
                self._playing = True
            elif self._ended:
                self._active = False
                return silence, FrameKind.IDLE
            else:
                return silence, FrameKind.WAITING
        if self._buffered == 0:
            if self._ended:
                self._active = self._playing = False
                return silence, FrameKind.IDLE
            self._current_underrun_frames += 1
            if self._current_underrun_frames == 1:
                self.stats.underruns += 1
            self.stats.longest_underrun_ms = max(
                self.stats.longest_underrun_ms, self._current_underrun_frames * self.frame_ms
            )
            return silence, FrameKind.UNDERRUN
        self._current_underrun_frames = 0
        frame = self._take(self.frame_samples)
        self.stats.frames_played += 1
        if frame.size < self.frame_samples:
            frame = np.pad(frame, (0, self.frame_samples - frame.size))
        return frame, FrameKind.AUDIO

    def _take(self, count: int) -> np.ndarray:
        taken, need = [], count
        while need and self._pieces:
            head = self._pieces[0]
            if head.size <= need:
                taken.append(self._pieces.pop(0))
                need -= head.size
            else:
                taken.append(head[:need])
                self._pieces[0] = head[need:]
                need = 0
        out = np.concatenate(taken) if taken else np.zeros(0, np.float32)
        self._buffered -= out.size
        return out
