"""How long a stream is: in seconds, in codec frames and in decode steps (the length rule).

Every part of the server takes a stream's length from here: the edge (rate limits, and the KV
and context estimates of admission) and both engines (when to stop). A request gets
``len(text) / chars_per_second`` seconds, at least ``min_duration_s``, capped by its own
``max_duration_s`` (when given) and by the server's limit (a model whose text does not set its
length, a music model's description, declares a default duration instead: the request's own
``max_duration_s`` or that default, capped by the server's limit); that duration is the nearest
whole number of codec frames; a model makes ``n`` frames in ``n * steps_per_frame + tail_steps``
decode steps (none for no frames)::

    text, max_duration_s --request_duration_s--> seconds --stream_length--> frames, steps

Capacity is quoted for the *nominal stream*: :data:`NOMINAL_TEXT` (its prompt is the "nominal
prompt" whose first chunk is due at the TTFA target) and ``admission.nominal_stream_s`` of audio.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from cadenza.config import LimitsConfig

NOMINAL_TEXT_CHARS = 64
"""Characters in the text of the nominal stream."""
NOMINAL_TEXT = "x" * NOMINAL_TEXT_CHARS


class FrameSteps(Protocol):
    """How a model's decode steps make codec frames: a token layout, or the
    :class:`~cadenza.contract.kv_memory.StreamShape` the engine announces for it."""

    @property
    def steps_per_frame(self) -> int: ...

    @property
    def tail_steps(self) -> int:
        """Steps after the last frame's first (the late codebooks of a delay pattern)."""
        ...


@dataclass(frozen=True)
class StreamLength:
    """``frames`` codec frames, made in ``steps`` decode steps."""

    frames: int
    steps: int


def derive_duration_s(
    text: str,
    max_duration_s: float | None,
    *,
    chars_per_second: float,
    min_duration_s: float,
    server_max_duration_s: float,
    default_duration_s: float | None = None,
) -> float:
    """Audio length a request gets when the model does not end it first. With
    ``default_duration_s`` (a model whose text does not set the length), exactly
    ``max_duration_s`` when given, else that default; either capped by the server's limit."""
    if default_duration_s is not None:
        wanted = default_duration_s if max_duration_s is None else max_duration_s
        return min(wanted, server_max_duration_s)
    duration = max(len(text) / chars_per_second, min_duration_s)
    cap = (
        server_max_duration_s
        if max_duration_s is None
        else min(max_duration_s, server_max_duration_s)
    )
    return min(duration, cap)


def request_duration_s(
    text: str,
    max_duration_s: float | None,
    limits: LimitsConfig,
    default_duration_s: float | None = None,
) -> float:
    """:func:`derive_duration_s` with the server's limits (``default_duration_s``: the
    model's, when its text does not set the length)."""
    return derive_duration_s(
        text,
        max_duration_s,
        chars_per_second=limits.chars_per_second,
        min_duration_s=limits.min_duration_s,
        server_max_duration_s=limits.max_duration_s,
        default_duration_s=default_duration_s,
    )


def frames_for_duration(duration_s: float, frame_rate: float) -> int:
    """Codec frames in ``duration_s`` seconds (rounded to the nearest frame)."""
    return max(0, round(duration_s * frame_rate))


def steps_for_frames(num_frames: int, steps_per_frame: int, tail_steps: int) -> int:
    """Decode steps that produce ``num_frames`` codec frames: ``steps_per_frame`` each, plus
    ``tail_steps`` after the last (the delay pattern's late codebooks); none for no frames."""
    return num_frames * steps_per_frame + tail_steps if num_frames > 0 else 0


def stream_length(duration_s: float, frame_rate: float, model: FrameSteps) -> StreamLength:
    """The frames of ``duration_s`` seconds at ``frame_rate``, and the decode steps ``model``
    takes to make them: what a stream of that duration gets (the engine stops it there unless
    the model ends it first; admission reserves and costs exactly that)."""
    frames = frames_for_duration(duration_s, frame_rate)
    return StreamLength(frames, steps_for_frames(frames, model.steps_per_frame, model.tail_steps))
