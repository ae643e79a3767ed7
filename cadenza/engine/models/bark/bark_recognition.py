"""Whether a name is a Bark checkpoint, from its ``config.json`` alone: what the engine
builder, ``cadenza generate`` and ``cadenza plan`` ask before deciding how to run a model
(no torch or ``transformers`` import here)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cadenza.engine.models.checkpoint import read_json
from cadenza.hub_cache import resolve_checkpoint


def recognises(directory: Path, config: dict[str, Any]) -> bool:
    """Whether ``config.json`` is a Bark checkpoint's."""
    return config.get("model_type") == "bark"


def bark_directory(name_or_path: str) -> Path | None:
    """The checkpoint directory when ``name_or_path`` names a Bark checkpoint (a directory or
    a hub id in the local hub cache), else ``None``."""
    directory = resolve_checkpoint(name_or_path, ("config.json",))
    if directory is None or not (directory / "config.json").exists():
        return None
    return directory if recognises(directory, read_json(directory / "config.json")) else None
