"""What a listener hears: client-side playout simulation of one stream's chunk arrivals.

Playout starts when the first chunk has arrived plus ``client_buffer_s`` of waiting, then
consumes audio in real time. Whenever the audio received so far has all been played before
the next chunk arrives, the player is starved: that gap is an *underrun*, and playback resumes
the moment the chunk lands (no re-buffering). The time between a chunk's arrival and the
previous chunk's arrival, minus the previous chunk's duration, is its arrival *jitter*.
Playback ends when the last of the audio has been played (the closed loop's listeners ask for
their next utterance then).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Chunk:
    arrival_s: float  # monotonic seconds
    audio_s: float  # seconds of audio it carries


@dataclass(frozen=True)
class Underrun:
    at_s: float  # when the player ran dry, relative to the request
    duration_s: float


@dataclass(frozen=True)
class Playout:
    audio_s: float
    longest_underrun_s: float
    total_underrun_s: float
    underruns: tuple[Underrun, ...] = field(default_factory=tuple)
    jitter_p95_s: float = 0.0
    generation_s: float = 0.0  # first to last chunk arrival
    ends_s: float = 0.0  # monotonic seconds when the listener has heard it all (0: unknown)
    starved_s: tuple[float, ...] = ()  # per chunk: how long the player had waited for it


def simulate_playout(chunks: list[Chunk], client_buffer_s: float, origin_s: float) -> Playout:
    """Underruns of ``chunks`` (in arrival order) for a player buffering ``client_buffer_s``;
    underrun times are reported relative to ``origin_s`` (the request's start)."""
    if not chunks:
        return Playout(0.0, 0.0, 0.0)
    buffer_end = chunks[0].arrival_s + client_buffer_s  # when the received audio runs out
    underruns: list[Underrun] = []
    starved: list[float] = []
    for chunk in chunks:
        starved.append(max(chunk.arrival_s - buffer_end, 0.0))
        if chunk.arrival_s > buffer_end:
            underruns.append(Underrun(buffer_end - origin_s, chunk.arrival_s - buffer_end))
            buffer_end = chunk.arrival_s
        buffer_end += chunk.audio_s
    jitter = sorted(
        abs(b.arrival_s - a.arrival_s - a.audio_s) for a, b in itertools.pairwise(chunks)
    )
    return Playout(
        audio_s=sum(c.audio_s for c in chunks),
        longest_underrun_s=max((u.duration_s for u in underruns), default=0.0),
        total_underrun_s=sum(u.duration_s for u in underruns),
        underruns=tuple(underruns),
        jitter_p95_s=jitter[int(0.95 * (len(jitter) - 1))] if jitter else 0.0,
        generation_s=chunks[-1].arrival_s - chunks[0].arrival_s,
        ends_s=buffer_end,
        starved_s=tuple(starved),
    )
