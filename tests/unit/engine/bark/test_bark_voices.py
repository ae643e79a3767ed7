"""Bark's voice presets as ``speaker_embeddings_path.json`` lists them; bad ones refused."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from cadenza.bench.random_bark import save_voice
from cadenza.engine.models.bark.bark_voices import VoicePresetError, load_voice_presets


def _load(directory: Path) -> dict[str, object]:
    return dict(load_voice_presets(directory, 2, 8, 1024))


def test_presets_load_and_the_repository_entry_is_skipped(tmp_path: Path) -> None:
    assert _load(tmp_path) == {}
    save_voice(tmp_path, "v2/en_speaker_0", seed=1, frames=30, semantic=20)
    presets = load_voice_presets(tmp_path, 2, 8, 1024)
    assert list(presets) == ["v2/en_speaker_0"]
    assert presets["v2/en_speaker_0"].coarse.shape == (2, 30)


def _index(directory: Path) -> dict[str, dict[str, str]]:
    return json.loads((directory / "speaker_embeddings_path.json").read_text())


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (
            lambda d, f: np.save(d / f["coarse_prompt"], np.zeros((3, 30), dtype=np.int64)),
            "3 coarse",
        ),
        (lambda d, f: np.save(d / f["fine_prompt"], np.full((8, 30), 1024)), "outside 0..1023"),
        (lambda d, f: np.save(d / f["semantic_prompt"], np.zeros((2, 2))), "1-D integer"),
        (lambda d, f: (d / f["semantic_prompt"]).write_bytes(b"garbage"), "semantic_prompt"),
    ],
)
def test_bad_arrays_are_named(tmp_path: Path, damage: object, message: str) -> None:
    save_voice(tmp_path, "v", seed=1, frames=30, semantic=20)
    damage(tmp_path, _index(tmp_path)["v"])  # type: ignore[operator]
    with pytest.raises(VoicePresetError, match=message):
        _load(tmp_path)


def test_bad_indexes_are_named(tmp_path: Path) -> None:
    index = tmp_path / "speaker_embeddings_path.json"
    index.write_text("{not json")
    with pytest.raises(VoicePresetError, match=r"speaker_embeddings_path\.json"):
        _load(tmp_path)
    index.write_text(json.dumps({"v": {"semantic_prompt": "a.npy"}}))
    with pytest.raises(VoicePresetError, match="lacks"):
        _load(tmp_path)
    files = {key: "../outside.npy" for key in ("semantic_prompt", "coarse_prompt", "fine_prompt")}
    index.write_text(json.dumps({"v": files}))
    with pytest.raises(VoicePresetError, match="outside the checkpoint"):
        _load(tmp_path)
