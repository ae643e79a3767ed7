"""Codecs by name: the built-in names build from a seed; a directory loads a checkpoint (SNAC
when its config says so, else EnCodec)."""

from __future__ import annotations

from pathlib import Path

import torch

from cadenza.codecs.codec import AudioCodec
from cadenza.codecs.encodec import ENCODEC_24KHZ, load_encodec
from cadenza.codecs.snac import SNAC_24KHZ, is_snac_directory, load_snac

BUILT_IN_CODECS = (ENCODEC_24KHZ, SNAC_24KHZ)


def load_codec(
    name_or_path: str = ENCODEC_24KHZ,
    device: str | torch.device = "cpu",
    seed: int = 0,
    noise: bool = True,
) -> AudioCodec:
    """``"encodec_24khz"`` or ``"snac_24khz"`` (random weights from ``seed``), or a local
    checkpoint directory of either. ``noise``: SNAC's noise layers on (the model's behaviour)
    or off (reproducible audio). Raises :class:`~cadenza.codecs.codec.CodecError` for anything
    else."""
    if name_or_path == SNAC_24KHZ or (
        Path(name_or_path).is_dir() and is_snac_directory(Path(name_or_path))
    ):
        return load_snac(name_or_path, device=device, seed=seed, noise=noise)
    return load_encodec(name_or_path, device=device, seed=seed)
