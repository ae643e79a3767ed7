"""Model names and how to build them. Built-in names need no files; paths load checkpoints."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from cadenza.engine.models.cadenza_tiny import MODEL_NAME as CADENZA_TINY
from cadenza.engine.models.cadenza_tiny import CadenzaTinyModel, CadenzaTinySpec


class UnknownModelError(ValueError):
    """The name is not built in and is not a checkpoint directory this version can load."""


_BUILT_IN: dict[str, Callable[[int], CadenzaTinyModel]] = {
    CADENZA_TINY: lambda seed: CadenzaTinyModel.from_seed(seed, CadenzaTinySpec()),
}


def built_in_models() -> list[str]:
    return sorted(_BUILT_IN)


def load_model(name_or_path: str, seed: int = 0) -> CadenzaTinyModel:
    """Build a built-in model from ``seed``, or load a local checkpoint directory.

    Raises :class:`UnknownModelError` naming what is available.
    """
    if name_or_path in _BUILT_IN:
        return _BUILT_IN[name_or_path](seed)
    if Path(name_or_path).is_dir():
        raise UnknownModelError(
            f"{name_or_path!r}: loading checkpoint directories arrives with the Llama family; "
            f"built-in models: {', '.join(built_in_models())}"
        )
    raise UnknownModelError(
        f"unknown model {name_or_path!r}: not a built-in name ({', '.join(built_in_models())}) "
        "nor a local directory"
    )
