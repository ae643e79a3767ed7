"""Codecs by name: the built-in names build from a seed; a directory loads a checkpoint."""

from __future__ import annotations

import torch

from cadenza.codecs.codec import AudioCodec
from cadenza.codecs.encodec import load_encodec


def load_codec(
    name_or_path: str = "encodec_24khz", device: str | torch.device = "cpu", seed: int = 0
) -> AudioCodec:
    """``"encodec_24khz"`` (random weights from ``seed``) or a local Hugging Face EnCodec
    directory. Raises :class:`~cadenza.codecs.codec.CodecError` for anything else."""
    return load_encodec(name_or_path, device=device, seed=seed)
