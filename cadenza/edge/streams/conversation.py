"""A session's conversation: the turns a conversational model (Sesame CSM) hears as context.

A session in conversation mode (``speak`` with ``conversation: true``) keeps, oldest first,
what the user said (microphone audio, with an optional transcript, as one of the model's
voices) and what the model said (the codec frames its utterance was decoded from). Each new
``speak`` sends them as :class:`~cadenza.contract.request.ContextTurn`\\ s before its text, so
the engine's prompt is the previous prompt plus the new turns: its prefix cache then computes
only what is new. The context is bounded: once the turns' audio adds up to more than
``max_context_s``, the oldest turns are dropped (whole turns; the next prompt then shares no
prefix with the previous one and is computed in full once).

A conversation belongs to one model (turns are that model's codec frames and voices). Only
answers said to their end join it: a cancelled (barged-in) or failed answer, and the user turn
that asked it, are left out.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from cadenza.contract.request import ContextTurn, FinishReason, StreamOutput


@dataclass(frozen=True)
class _Turn:
    turn: ContextTurn
    seconds: float


class Conversation:
    def __init__(self, max_context_s: float) -> None:
        self.max_context_s = max_context_s
        self.model: str | None = None
        self._turns: list[_Turn] = []

    @property
    def turns(self) -> tuple[ContextTurn, ...]:
        return tuple(t.turn for t in self._turns)

    @property
    def audio_s(self) -> float:
        return sum(t.seconds for t in self._turns)

    def belongs_to(self, model: str) -> bool:
        """Whether turns for ``model`` may join (an empty conversation takes any model)."""
        return self.model is None or self.model == model or not self._turns

    def add_user_turn(
        self, model: str, voice: str, text: str, audio: bytes, sample_rate: int
    ) -> None:
        """What the user said: float32 samples at the codec's ``sample_rate``."""
        self._add(
            model, ContextTurn(voice=voice, text=text, audio=audio), len(audio) / 4 / sample_rate
        )

    def add_model_turn(
        self, model: str, voice: str, text: str, codes: np.ndarray, frame_rate: float
    ) -> None:
        """What the model said: ``codes [frames, codebooks]`` (nothing is kept for none)."""
        if codes.size == 0:
            return
        frames = tuple(tuple(int(c) for c in frame) for frame in codes.tolist())
        self._add(
            model, ContextTurn(voice=voice, text=text, codes=frames), len(frames) / frame_rate
        )

    def reset(self) -> None:
        self._turns.clear()
        self.model = None

    def _add(self, model: str, turn: ContextTurn, seconds: float) -> None:
        if not self.belongs_to(model):
            raise ValueError(f"the conversation is with {self.model!r}; reset it first")
        self.model = model
        self._turns.append(_Turn(turn, seconds))
        while len(self._turns) > 1 and self.audio_s > self.max_context_s:
            self._turns.pop(0)
        if self.audio_s > self.max_context_s:  # a single turn longer than the whole bound
            self._turns.clear()


class SaidFrames:
    """The codec frames an utterance's audio came from, gathered from its outputs, and whether
    it was said to its end (what joins a conversation as the model's turn)."""

    def __init__(self) -> None:
        self._pieces: list[np.ndarray] = []
        self.frame_rate = 0.0
        self.complete = False  # ended by the model or its length, not cancelled nor failed
        self.text: str | None = None  # what was said, when not the speak's text (text streams)

    def add(self, output: StreamOutput) -> None:
        if output.codes is not None and output.codes.size:
            self._pieces.append(output.codes)
        if output.finish_reason in (FinishReason.EOS, FinishReason.LENGTH):
            self.complete = True

    def codes(self) -> np.ndarray | None:
        """``[frames, codebooks]`` so far (``None``: none)."""
        return np.concatenate(self._pieces) if self._pieces else None
