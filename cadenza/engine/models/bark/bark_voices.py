"""Bark's voice presets: per voice, a semantic history ``[T]``, a coarse history ``[2, T]`` and
a fine history ``[8, T]`` of codebook ids, listed in ``speaker_embeddings_path.json`` (voice name
to the three ``.npy`` files, relative to the checkpoint) as ``transformers``' ``BarkProcessor``
reads them."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

PRESET_INDEX = "speaker_embeddings_path.json"
_SHAPES = {"semantic_prompt": 1, "coarse_prompt": 2, "fine_prompt": 2}


class VoicePresetError(ValueError):
    """A voice preset is missing, unreadable or of the wrong shape; the message says which."""


@dataclass(frozen=True)
class VoicePreset:
    """One voice's histories (int64 tensors)."""

    semantic: torch.Tensor  # [T]
    coarse: torch.Tensor  # [2, T]
    fine: torch.Tensor  # [8, T]


def _within(directory: Path, relative: str) -> Path:
    path = (directory / relative).resolve()
    if directory.resolve() not in path.parents:
        raise VoicePresetError(f"{PRESET_INDEX}: {relative!r} is outside the checkpoint")
    return path


def load_voice_presets(
    directory: Path, n_coarse: int, n_fine: int, codebook_size: int
) -> dict[str, VoicePreset]:
    """Every preset the checkpoint lists (none when it has no ``speaker_embeddings_path.json``),
    read and checked: shapes, codebook counts, ids within the codebook."""
    index_path = directory / PRESET_INDEX
    if not index_path.exists():
        return {}
    try:
        index = json.loads(index_path.read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise VoicePresetError(f"{index_path}: {error}") from error
    if not isinstance(index, dict):
        raise VoicePresetError(f"{index_path}: not an object of voices")
    presets: dict[str, VoicePreset] = {}
    for name, files in index.items():
        if name == "repo_or_path":
            continue
        if not isinstance(files, dict) or set(_SHAPES) - set(files):
            raise VoicePresetError(f"{index_path}: voice {name!r} lacks {sorted(_SHAPES)}")
        arrays: dict[str, torch.Tensor] = {}
        for key, dims in _SHAPES.items():
            path = _within(directory, str(files[key]))
            try:
                array = np.load(path, allow_pickle=False)
            except (OSError, ValueError) as error:
                raise VoicePresetError(f"voice {name!r} {key}: {error}") from error
            if array.ndim != dims or not np.issubdtype(array.dtype, np.integer):
                raise VoicePresetError(f"voice {name!r} {key}: not a {dims}-D integer array")
            arrays[key] = torch.from_numpy(array.astype(np.int64))
        coarse, fine = arrays["coarse_prompt"], arrays["fine_prompt"]
        if coarse.shape[0] != n_coarse or fine.shape[0] != n_fine:
            raise VoicePresetError(
                f"voice {name!r}: {coarse.shape[0]} coarse and {fine.shape[0]} fine codebooks, "
                f"expected {n_coarse} and {n_fine}"
            )
        for key in ("coarse_prompt", "fine_prompt"):
            if (
                arrays[key].numel()
                and not 0 <= int(arrays[key].min()) <= int(arrays[key].max()) < codebook_size
            ):
                raise VoicePresetError(f"voice {name!r} {key}: ids outside 0..{codebook_size - 1}")
        presets[name] = VoicePreset(arrays["semantic_prompt"], coarse, fine)
    return presets
