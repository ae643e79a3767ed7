"""How long a request's audio may be, in seconds and in codec frames.

Every part of the server takes a request's length from here: the edge (rate limits and the
KV estimate of admission) and both engines (when to stop). A request gets ``len(text) /
chars_per_second`` seconds, at least ``min_duration_s``, capped by its own ``max_duration_s``
(when given) and by the server's limit.
"""

from __future__ import annotations

from cadenza.config import LimitsConfig


def derive_duration_s(
    text: str,
    max_duration_s: float | None,
    *,
    chars_per_second: float,
    min_duration_s: float,
    server_max_duration_s: float,
) -> float:
    """Audio length a request gets when the model does not end it first."""
    duration = max(len(text) / chars_per_second, min_duration_s)
    cap = (
        server_max_duration_s
        if max_duration_s is None
        else min(max_duration_s, server_max_duration_s)
    )
    return min(duration, cap)


def request_duration_s(text: str, max_duration_s: float | None, limits: LimitsConfig) -> float:
    """:func:`derive_duration_s` with the server's limits."""
    return derive_duration_s(
        text,
        max_duration_s,
        chars_per_second=limits.chars_per_second,
        min_duration_s=limits.min_duration_s,
        server_max_duration_s=limits.max_duration_s,
    )


def frames_for_duration(duration_s: float, frame_rate: float) -> int:
    """Codec frames in ``duration_s`` seconds (rounded to the nearest frame)."""
    return max(0, round(duration_s * frame_rate))
