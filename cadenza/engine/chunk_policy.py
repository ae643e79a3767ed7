"""When a stream's frames go through the codec: the audio chunking policy (no I/O, no state).

The chunk rule (:func:`config_in_codec_frames`): ``realtime.first_chunk_ms`` and
``realtime.chunk_ms`` are durations; a codec gets them in its own frames (rounded, at least
one), and its first chunk also waits for the frames the codec looks ahead, so that it brings
its full duration of audio::

    codec                frame rate   look-ahead   first chunk (107 ms)   later chunks (200 ms)
    EnCodec 24 kHz       75 Hz        0            8                      15
    Mimi                 12.5 Hz      0            1                      2 (160 ms of 200)
    SNAC 24 kHz          11.7 Hz      3            1 + 3 = 4              2 (171 ms of 200)

Both engines take their chunk sizes from it, and announce them in their
:class:`~cadenza.contract.realtime_plan.RealtimePlan` (admission never recomputes them).

A stream's first chunk is small (``first_chunk_frames``, for a fast first audio); later chunks
are ``chunk_frames``; a stream that just finished decodes what it has left. When any stream's
chunk is due, streams at least a third of the way to theirs join the same decoder call: the
codec runs in large batches, and streams that decoded together stay in phase, so the next
calls are large too::

    frames pending   A 15 (due)   B 6 (joins: >= 15 // 3)   C 3 (waits)   D 2, finished (due)
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass

from cadenza.config import CadenzaConfig
from cadenza.engine.sequence import Sequence


@dataclass(frozen=True)
class CodecFrames:
    """The configured durations as an engine with its codec counts them (all zeros for a
    model without audio)."""

    first_chunk_frames: int  # the look-ahead included
    chunk_frames: int
    calibration_steps: int  # decode steps timed per calibration point
    replay_frames: int  # fed to a resumed stream's decoder (0: none)


NO_FRAMES = CodecFrames(0, 0, 0, 0)


def codec_chunk_frames(duration_ms: float, frame_rate: float) -> int:
    """A configured chunk duration in the codec's own frames: rounded, at least one frame
    (SNAC at 11.7 Hz: 200 ms -> 2, 107 ms -> 1)."""
    return max(1, round(duration_ms * frame_rate / 1000.0))


def config_in_codec_frames(
    config: CadenzaConfig, frame_rate: float, lookahead_frames: int, steps_per_frame: int
) -> CodecFrames:
    """The durations of ``config`` in the frames of a codec of ``frame_rate`` frames a second
    that looks ``lookahead_frames`` ahead: ``chunk_frames`` the later chunks' duration,
    ``first_chunk_frames`` the first's plus the look-ahead (a codec that looks ahead holds a
    chunk's last frames back: the first chunk waits for them, so that it brings its full
    duration of audio), ``calibration_steps`` the calibration's stretch of audio in the decode
    steps of a layout of ``steps_per_frame`` (a model of 12.5 frames a second is timed over 20
    steps: 1.6 s of audio), and ``replay_frames`` the resume replay. What an engine with that
    codec runs with."""
    realtime = config.realtime
    return CodecFrames(
        first_chunk_frames=codec_chunk_frames(realtime.first_chunk_ms, frame_rate)
        + lookahead_frames,
        chunk_frames=codec_chunk_frames(realtime.chunk_ms, frame_rate),
        calibration_steps=max(
            2,
            codec_chunk_frames(config.calibration.duration_ms, frame_rate) * steps_per_frame,
        ),
        replay_frames=round(config.supervision.resume_replay_ms * frame_rate / 1000.0),
    )


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
