"""Hub ids resolve from the local cache only, with errors that say what is missing."""

from __future__ import annotations

import pytest
from huggingface_hub import constants

from cadenza.hub_cache import NotInHubCache, resolve_checkpoint


@pytest.fixture
def hub_cache(tmp_path, monkeypatch):
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    snapshot = tmp_path / "models--canopy--voice" / "snapshots" / ("a" * 40)
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    (tmp_path / "models--canopy--voice" / "refs").mkdir()
    (tmp_path / "models--canopy--voice" / "refs" / "main").write_text("a" * 40)
    return snapshot


def test_directories_and_names(tmp_path) -> None:
    assert resolve_checkpoint(str(tmp_path)) == tmp_path
    assert resolve_checkpoint("cadenza-tiny") is None
    assert resolve_checkpoint("not a/hub id") is None


def test_a_cached_hub_id_is_its_snapshot(hub_cache) -> None:
    assert resolve_checkpoint("canopy/voice", ("config.json",)) == hub_cache


def test_missing_snapshots_and_files_are_named(hub_cache) -> None:
    with pytest.raises(NotInHubCache, match=r"canopy/other.*hf download"):
        resolve_checkpoint("canopy/other")
    with pytest.raises(NotInHubCache, match=r"lacks model\.safetensors"):
        resolve_checkpoint("canopy/voice", ("config.json", "model.safetensors"))
