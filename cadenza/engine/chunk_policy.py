"""When a stream's frames go through the codec: the audio chunking policy (no I/O, no state).

A stream's first chunk is small (``first_chunk_frames``, for a fast first audio); later chunks
are ``chunk_frames``; a stream that just finished decodes what it has left. When any stream's
chunk is due, streams at least a third of the way to theirs join the same decoder call: the
codec runs in large batches, and streams that decoded together stay in phase, so the next
calls are large too::

    frames pending   A 15 (due)   B 6 (joins: >= 15 // 3)   C 3 (waits)   D 2, finished (due)
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

from cadenza.config import CHUNK_FRAME_RATE
from cadenza.engine.sequence import Sequence


def codec_chunk_frames(frames_at_75hz: int, frame_rate: float) -> int:
    """A configured chunk size in the codec's own frames: the same duration, rounded, at
    least one frame (SNAC at 11.7 Hz: 15 -> 2, 8 -> 1)."""
    return max(1, round(frames_at_75hz * frame_rate / CHUNK_FRAME_RATE))


def streams_to_decode(
    pending_frames: Mapping[Sequence, int],
    finished: Collection[Sequence],
    *,
    first_chunk_frames: int,
    chunk_frames: int,
) -> list[Sequence]:
    """The streams (keys of ``pending_frames``: frames complete but not yet decoded) whose
    frames go through the codec this step, in the order given."""

    def due(seq: Sequence) -> bool:
        threshold = first_chunk_frames if seq.frames_sent == 0 else chunk_frames
        return seq in finished or pending_frames[seq] >= threshold

    if not any(due(seq) for seq in pending_frames):
        return []
    join_frames = max(1, chunk_frames // 3)
    return [
        seq
        for seq, pending in pending_frames.items()
        if due(seq) or (seq.frames_sent > 0 and pending >= join_frames)
    ]
