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
class ResumePoint:
    """Where a stream picks up after the engine serving it was lost: the rows it had
    generated, in order, as its outputs carried them, and how many codec frames of audio
    its listener has had. The new engine prefills the prompt and these rows, rebuilds the
    codec's streaming state from the frames already heard, and goes on from the next row."""

    rows: tuple[tuple[int, ...], ...]
    frames_sent: int


@dataclass(frozen=True)
class ContextTurn:
    """An earlier turn of a conversation, for models that take one (Sesame CSM; Dia, whose
    turns are the clips it continues): who spoke (one of the model's voices), what was said
    (may be empty when unknown, except to Dia, which needs the transcript) and how it sounded,
    as the codec's frames (``[frames][codebooks]``, what the model said, as its outputs carried
    them) or as float32 little-endian mono samples at the codec's rate (what a user said;
    the engine encodes them)."""

    voice: str
    text: str = ""
    codes: tuple[tuple[int, ...], ...] = ()
    audio: bytes | None = None


@dataclass(frozen=True)
class SynthesisRequest:
    """One stream: speak ``text`` in ``voice``, at most ``max_duration_s`` seconds of audio.

    ``prompt_audio``: optional speech prompt (a microphone recording), float32 little-endian
    mono samples at ``prompt_sample_rate``, which must be the codec's rate (the edge
    resamples); the engine encodes it to codec frames that come before the text.

    ``resume``: set when the edge moves a running stream to another engine (see
    :class:`ResumePoint`); everything else is the original request. ``context``: the
    conversation so far (:class:`ContextTurn`, oldest first), placed before the text by
    models that take context."""

    request_id: str
    text: str
    voice: str = "default"
    max_duration_s: float | None = None
    sampling: SamplingParams = field(default_factory=SamplingParams)
    prompt_audio: bytes | None = None
    prompt_sample_rate: int = 24000
    resume: ResumePoint | None = None
    context: tuple[ContextTurn, ...] = ()

    @property
    def prompt_audio_samples(self) -> int:
        return len(self.prompt_audio) // 4 if self.prompt_audio else 0

    def context_audio_s(self, frame_rate: float) -> float:
        """Seconds of audio in :attr:`context` (codes at ``frame_rate``, audio at
        :attr:`prompt_sample_rate`)."""
        frames = sum(len(turn.codes) for turn in self.context)
        samples = sum(len(turn.audio) // 4 for turn in self.context if turn.audio)
        return frames / frame_rate + samples / self.prompt_sample_rate


@dataclass
class StreamOutput:
    """A piece of one stream: new audio (float32 mono at the codec rate, possibly empty), the
    codec frames it was decoded from (``[frames, codebooks]`` uint16, possibly ``None``), the
    token rows generated since the stream's previous output (``[rows, width]`` int32, possibly
    ``None``: what the edge keeps to resume the stream elsewhere) and, on the last piece, why
    it finished (with ``error`` and its ``error_code`` on failure)."""

    request_id: str
    audio: np.ndarray
    finish_reason: FinishReason | None = None
    error: str | None = None
    codes: np.ndarray | None = None
    error_code: str | None = None
    rows: np.ndarray | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None
