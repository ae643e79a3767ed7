"""A Bark stream's request (text, voice preset, per-stage sampling, seed) and what it gets
back (:class:`BarkChunk` per step, :class:`BarkResult` at its end), for
:class:`~cadenza.engine.models.bark.bark_batch.BarkBatch` and the paths that drive it."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


class BarkRequestError(ValueError):
    """A request Bark cannot take; ``param`` names the field."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


@dataclass(frozen=True)
class BarkSampling:
    """Per-stage sampling: temperatures (``None``: greedy), ``min_eos_p`` (end the semantic
    tokens once the end token's probability passes it), a cap on semantic tokens, the seed."""

    semantic_temperature: float | None = None
    coarse_temperature: float | None = None
    fine_temperature: float | None = None
    min_eos_p: float | None = None
    max_semantic_tokens: int | None = None
    seed: int = 0

    def check(self, limit: int) -> None:
        """Raise :class:`BarkRequestError` for the first setting out of range."""
        for name in ("semantic_temperature", "coarse_temperature", "fine_temperature"):
            value = getattr(self, name)
            if value is not None and not (math.isfinite(value) and 0.0 < value <= 10.0):
                raise BarkRequestError(f"{name} must be in (0, 10] or null, got {value}", name)
        if self.min_eos_p is not None and not 0.0 < self.min_eos_p <= 1.0:
            raise BarkRequestError(
                f"min_eos_p must be in (0, 1], got {self.min_eos_p}", "min_eos_p"
            )
        cap = self.max_semantic_tokens
        if cap is not None and not 1 <= cap <= limit:
            raise BarkRequestError(
                f"max_semantic_tokens must be in 1..{limit}, got {cap}", "max_semantic_tokens"
            )
        if not 0 <= self.seed < 2**63:
            raise BarkRequestError(f"seed must be in 0..2**63-1, got {self.seed}", "seed")


@dataclass(frozen=True)
class BarkRequest:
    text: str
    voice: str | None = None  # a preset's name; None: no voice history (Bark picks a speaker)
    sampling: BarkSampling = BarkSampling()


@dataclass(frozen=True)
class BarkResult:
    """A finished stream: its tokens at every stage and its audio (float32, 24 kHz)."""

    stream_id: int
    semantic: list[int]
    coarse: torch.Tensor  # [2, frames]
    fine: torch.Tensor  # [8, frames]
    audio: torch.Tensor  # [frames * hop_length]


@dataclass(frozen=True)
class BarkChunk:
    """Audio a stream made in one step (float32, 24 kHz; possibly empty), the EnCodec frames
    it was decoded from (``[frames, 8]``; one frame a hop of samples), and its
    :class:`BarkResult` when the stream finished with it."""

    stream_id: int
    audio: torch.Tensor
    result: BarkResult | None = None
    codes: torch.Tensor | None = None
