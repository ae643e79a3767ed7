"""Checkpoints by Hugging Face hub id, from the local hub cache only (the server never
downloads): ``owner/name`` resolves to its cached snapshot directory."""

from __future__ import annotations

import re
from pathlib import Path

HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")


class NotInHubCache(FileNotFoundError):
    """A hub id whose snapshot (or some of its files) is not in the local cache."""


def resolve_checkpoint(name_or_path: str, required: tuple[str, ...] = ()) -> Path | None:
    """``name_or_path`` itself when it is a directory; the cached snapshot of a hub id
    (``owner/name``); ``None`` when it is neither (a built-in name, say). Raises
    :class:`NotInHubCache` naming what is missing."""
    path = Path(name_or_path)
    if path.is_dir():
        return path
    if not HUB_ID.fullmatch(name_or_path):
        return None
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        snapshot = Path(snapshot_download(name_or_path, local_files_only=True))
    except LocalEntryNotFoundError as exc:
        raise NotInHubCache(
            f"{name_or_path!r} is neither a directory nor in the local Hugging Face cache "
            f"({constants.HF_HUB_CACHE}); fetch it where there is network access "
            f"(`hf download {name_or_path}`) or pass its directory"
        ) from exc
    missing = [name for name in required if not (snapshot / name).exists()]
    if missing:
        raise NotInHubCache(
            f"the cached snapshot of {name_or_path!r} ({snapshot}) lacks {', '.join(missing)}"
        )
    return snapshot
