"""What a WebSocket listener hears, estimated on the server: the ``stats`` of a ``done``."""

from __future__ import annotations

from dataclasses import dataclass

from cadenza.edge.streams import protocol


@dataclass
class ListenerEstimate:
    """What a listener who starts playing at the first audio would hear: a chunk sent after
    its own playback time would have found the player empty (an underrun, by how late).
    Times are seconds since the utterance started."""

    first_audio_s: float | None = None  # moved on by a text stream's waits for text
    ttfa_s: float | None = None
    audio_s: float = 0.0
    chunks: int = 0
    underruns: int = 0
    longest_underrun_ms: float = 0.0
    segments: int | None = None  # a text stream's segments so far
    text_wait_s: float = 0.0  # a text stream's silence while it waited for text
    _held: bool = False
    _text_came_s: float | None = None

    def waiting_for_text(self) -> None:
        """The stream said everything it had and waits for text."""
        self._held = True

    def segment_started(self, now: float) -> None:
        """A text stream's segment went to the engine: if the listener had run out of audio
        before its text came, the silence until its first audio is the text's, no underrun."""
        self.segments = (self.segments or 0) + 1
        if self._held:
            self._held = False
            self._text_came_s = now

    def sent(self, seconds: float, now: float) -> None:
        if self.first_audio_s is None:
            self.first_audio_s = self.ttfa_s = now
        came, self._text_came_s = self._text_came_s, None
        ran_dry_s = self.first_audio_s + self.audio_s
        if came is not None and ran_dry_s < came and now > ran_dry_s:
            self.text_wait_s += now - ran_dry_s  # the listener starts again from here
            self.first_audio_s += now - ran_dry_s
        late_ms = 1000 * (now - (self.first_audio_s + self.audio_s))
        if late_ms > 0:
            self.underruns += 1
            self.longest_underrun_ms = max(self.longest_underrun_ms, late_ms)
        self.audio_s += seconds
        self.chunks += 1

    def done_message(self, stream_id: int, reason: str) -> str:
        """The ``done`` message, with this estimate as its ``stats``."""
        stats = {
            "ttfa_ms": round(1000 * (self.ttfa_s or 0.0), 1),
            "audio_s": round(self.audio_s, 3),
            "chunks": self.chunks,
            "underruns": self.underruns,
            "longest_underrun_ms": round(self.longest_underrun_ms, 1),
        }
        if self.segments is not None:
            stats |= {"segments": self.segments, "text_wait_ms": round(1000 * self.text_wait_s)}
        return protocol.server_message("done", stream_id=stream_id, reason=reason, stats=stats)
