"""Tiny random Bark checkpoints in the public layout
(:mod:`cadenza.engine.models.bark.random_bark`), with a second, shorter voice preset."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cadenza.engine.models.bark.random_bark import save_random_bark, save_voice
from tests.support.legacy_weight_norm import resave_with_legacy_weight_norm_names

VOICE = "v2/en_speaker_6"
SHORT_VOICE = "v2/de_speaker_1"


def build_tiny_bark(directory: Path, seed: int = 0, legacy_weight_norm: bool = False) -> Any:
    """Save a tiny random Bark to ``directory``; the ``transformers`` model it saved.
    ``legacy_weight_norm``: the codec's weight norm saved under ``weight_g`` / ``weight_v``, as
    suno/bark publishes it, rather than the names ``transformers`` saves today."""
    model = save_random_bark(directory, "bark-tiny", seed)
    save_voice(directory, SHORT_VOICE, seed=seed + 2, frames=120, semantic=80)
    if legacy_weight_norm:
        for path in directory.glob("*.safetensors"):
            resave_with_legacy_weight_norm_names(path)
    return model
