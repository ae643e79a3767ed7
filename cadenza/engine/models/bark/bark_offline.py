"""One Bark utterance offline (``cadenza generate --model BARK_DIR``): the checkpoint is
loaded, the request runs through :class:`~cadenza.engine.models.bark.bark_batch.BarkBatch`
alone, and the audio comes back whole. A server serves Bark through
:class:`~cadenza.engine.models.bark.bark_engine.BarkEngine`, which runs the same batch."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch

from cadenza.engine.models.bark.bark_batch import BarkBatch
from cadenza.engine.models.bark.bark_checkpoint import load_bark
from cadenza.engine.models.bark.bark_request import BarkRequest, BarkRequestError, BarkSampling

DEFAULT_VOICE = "default"
"""The voice name that means no preset: Bark then picks a speaker itself."""


@dataclass(frozen=True)
class BarkAudio:
    audio: np.ndarray  # float32 mono
    sample_rate: int
    voices: tuple[str, ...]


def synthesize_bark(
    directory: Path,
    text: str,
    voice: str,
    sampling: BarkSampling,
    max_duration_s: float | None = None,
) -> BarkAudio:
    """Speak ``text`` with the preset ``voice`` (or :data:`DEFAULT_VOICE`), at most about
    ``max_duration_s`` long (a cap on the semantic tokens, at Bark's semantic rate). Raises
    ``CheckpointError`` for a checkpoint it cannot load and ``BarkRequestError`` for a request
    Bark cannot take."""
    bark = load_bark(directory, torch.device("cpu"), torch.float32)
    if max_duration_s is not None:
        constants = bark.constants
        if not (math.isfinite(max_duration_s) and max_duration_s > 0):
            raise BarkRequestError("max_duration_s must be positive", "max_duration_s")
        cap = math.ceil(max_duration_s * constants.semantic_rate_hz)
        sampling = replace(
            sampling, max_semantic_tokens=min(cap, constants.max_new_semantic_tokens)
        )
    batch = BarkBatch(bark)
    batch.add(BarkRequest(text, None if voice == DEFAULT_VOICE else voice, sampling))
    (result,) = batch.run()
    voices = (DEFAULT_VOICE, *sorted(bark.voices))
    return BarkAudio(result.audio.numpy(), bark.codec.sample_rate, voices)
