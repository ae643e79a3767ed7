"""What a stream asks the engine for, and what the engine hands back. No torch here: the edge
process builds these too."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

import numpy as np

from cadenza.config import LimitsConfig
from cadenza.engine.sampling_params import SamplingParams


class FinishReason(enum.StrEnum):
    EOS = "eos"  # the model ended the utterance
    LENGTH = "length"  # the duration derived from the text (or max_duration_s) was reached
    CANCELLED = "cancelled"  # the client cancelled or went away
    ERROR = "error"  # this request failed; others were not affected


@dataclass(frozen=True)
class SynthesisRequest:
    """One stream: speak ``text`` in ``voice``, at most ``max_duration_s`` seconds of audio.

    ``prompt_audio``: optional speech prompt (a microphone recording), float32 little-endian
    mono samples at ``prompt_sample_rate``; the engine encodes it to codec frames that prefix
    the prompt."""

    request_id: str
    text: str
    voice: str = "default"
    max_duration_s: float | None = None
    sampling: SamplingParams = field(default_factory=SamplingParams)
    prompt_audio: bytes | None = None
    prompt_sample_rate: int = 24000


@dataclass
class StreamOutput:
    """A piece of one stream: new audio (float32 mono at the codec rate, possibly empty), the
    codec frames it was decoded from (``[frames, codebooks]`` uint16, possibly empty) and, on
    the last piece, why it finished."""

    request_id: str
    audio: np.ndarray
    finish_reason: FinishReason | None = None
    error: str | None = None
    codes: np.ndarray | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


def derive_duration_s(
    text: str,
    max_duration_s: float | None,
    *,
    chars_per_second: float,
    min_duration_s: float,
    server_max_duration_s: float,
) -> float:
    """Audio length a request gets when the model does not end it first.

    ``len(text) / chars_per_second`` seconds, at least ``min_duration_s``, capped by the
    request's ``max_duration_s`` (when given) and by the server's limit.
    """
    duration = max(len(text) / chars_per_second, min_duration_s)
    cap = (
        server_max_duration_s
        if max_duration_s is None
        else min(max_duration_s, server_max_duration_s)
    )
    return min(duration, cap)


def request_duration_s(text: str, max_duration_s: float | None, limits: LimitsConfig) -> float:
    """:func:`derive_duration_s` with the server's limits: what every part of the server
    (edge admission, rate limits, both engines) takes a request's length to be."""
    return derive_duration_s(
        text,
        max_duration_s,
        chars_per_second=limits.chars_per_second,
        min_duration_s=limits.min_duration_s,
        server_max_duration_s=limits.max_duration_s,
    )
