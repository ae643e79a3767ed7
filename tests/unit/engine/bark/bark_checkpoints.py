"""Tiny random Bark checkpoints in the public layout
(:mod:`cadenza.bench.random_bark`), with a second, shorter voice preset."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cadenza.bench.random_bark import save_random_bark, save_voice
from tests.support.legacy_weight_norm import resave_with_legacy_weight_norm_names

VOICE = "v2/en_speaker_6"
SHORT_VOICE = "v2/de_speaker_1"


SMALL_WINDOWS = {
    "coarse_acoustics_config": {
        "max_coarse_history": 120,
        "max_coarse_input_length": 64,
        "sliding_window_len": 30,
    },
    "fine_acoustics_config": {"max_fine_history_length": 64, "max_fine_input_length": 128},
}
"""Coarse and fine windows a tenth of the published ones: a stream runs through many coarse
windows and several fine windows in a few hundred steps (both sides read them from
``generation_config.json``)."""


def build_tiny_bark(
    directory: Path, seed: int = 0, legacy_weight_norm: bool = False, small_windows: bool = False
) -> Any:
    """Save a tiny random Bark to ``directory``; the ``transformers`` model it saved.
    ``legacy_weight_norm``: the codec's weight norm saved under ``weight_g`` / ``weight_v``, as
    suno/bark publishes it, rather than the names ``transformers`` saves today.
    ``small_windows``: :data:`SMALL_WINDOWS`."""
    windows = SMALL_WINDOWS if small_windows else None
    model = save_random_bark(directory, "bark-tiny", seed, windows)
    save_voice(directory, SHORT_VOICE, seed=seed + 2, frames=120, semantic=80)
    if legacy_weight_norm:
        for path in directory.glob("*.safetensors"):
            resave_with_legacy_weight_norm_names(path)
    return model
