"""What a stream asks the engine for, and what the engine hands back."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

import numpy as np

from cadenza.contract.sampling import SamplingParams


class FinishReason(enum.StrEnum):
    EOS = "eos"  # the model ended the utterance
    LENGTH = "length"  # the duration derived from the text (or max_duration_s) was reached
    CANCELLED = "cancelled"  # the client cancelled or went away
    ERROR = "error"  # this request failed; others were not affected


@dataclass(frozen=True)
class SynthesisRequest:
    """One stream: speak ``text`` in ``voice``, at most ``max_duration_s`` seconds of audio.

    ``prompt_audio``: optional speech prompt (a microphone recording), float32 little-endian
    mono samples at ``prompt_sample_rate``, which must be the codec's rate (the edge
    resamples); the engine encodes it to codec frames that come before the text."""

    request_id: str
    text: str
    voice: str = "default"
    max_duration_s: float | None = None
    sampling: SamplingParams = field(default_factory=SamplingParams)
    prompt_audio: bytes | None = None
    prompt_sample_rate: int = 24000

    @property
    def prompt_audio_samples(self) -> int:
        return len(self.prompt_audio) // 4 if self.prompt_audio else 0


@dataclass
class StreamOutput:
    """A piece of one stream: new audio (float32 mono at the codec rate, possibly empty), the
    codec frames it was decoded from (``[frames, codebooks]`` uint16, possibly ``None``) and,
    on the last piece, why it finished (with ``error`` and its ``error_code`` on failure)."""

    request_id: str
    audio: np.ndarray
    finish_reason: FinishReason | None = None
    error: str | None = None
    codes: np.ndarray | None = None
    error_code: str | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None
