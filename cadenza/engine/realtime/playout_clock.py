"""A stream's playout contract: when each of its audio frames must have reached the listener.

The first chunk is due ``ttfa_target`` after the request arrives (the engine's TTFA target, later
for a long prompt: :meth:`RealtimePlan.first_chunk_due_after_s`). The listener starts playing
once it holds ``reserve`` of audio past that first chunk's arrival, so frame ``f`` plays at
``playout_start + f * frame_period``. A chunk that arrives after its first frame's play time
is an underrun; ``slack`` (due minus delivery time) says by how much a chunk beat or missed
its deadline. A resumed stream starts over at ``first_frame`` (the frames its listener already
had): its next chunk is due like a first one, and frame ``f`` plays at ``playout_start +
(f - first_frame) * frame_period``.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class PlayoutClock:
    arrival_s: float
    ttfa_target_s: float
    frame_period_s: float
    reserve_s: float
    playout_start_s: float | None = None  # set when the first chunk is delivered
    first_frame: int = 0

    def due_s(self, frame: int) -> float:
        """When frame ``frame`` must be delivered (monotonic seconds)."""
        if self.playout_start_s is None:
            return self.arrival_s + self.ttfa_target_s
        return self.playout_start_s + (frame - self.first_frame) * self.frame_period_s

    def delivered(self, first_frame: int, now_s: float) -> float:
        """Record a chunk starting at ``first_frame`` delivered at ``now_s``; its slack in
        seconds (negative: late)."""
        slack = self.due_s(first_frame) - now_s
        if self.playout_start_s is None:
            self.playout_start_s = now_s + self.reserve_s
        return slack
