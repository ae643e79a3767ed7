"""A codec checkpoint loaded by ``transformers``, strictly: every weight its config asks for is
in the files, with its shape. ``from_pretrained`` would otherwise draw a missing weight at
random and decode noise without a word."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cadenza.codecs.codec import CodecError


def load_strictly(model_class: Any, directory: Path, family: str, **options: Any) -> Any:
    """``model_class.from_pretrained(directory, **options)``; raises :class:`CodecError`
    naming ``family`` when it cannot load or any weight is missing or of another shape."""
    try:
        model, info = model_class.from_pretrained(directory, output_loading_info=True, **options)
    except (OSError, ValueError, RuntimeError) as exc:
        raise CodecError(f"{directory}: cannot load the {family} checkpoint: {exc}") from exc
    missing = sorted(info.get("missing_keys", ()))
    mismatched = sorted(str(key) for key in info.get("mismatched_keys", ()))
    if missing or mismatched:
        raise CodecError(
            f"{directory}: the weights do not fit its config "
            f"(missing {missing[:5]}, mismatched {mismatched[:5]})"
        )
    return model
