"""Codecs by name: the built-in names build from a seed; a directory loads a checkpoint (Mimi
from a Mimi or Sesame CSM directory, the Pocket TTS audio tokenizer, DAC or SNAC when its
config says so, EnCodec from a MusicGen directory, else EnCodec)."""

from __future__ import annotations

import torch

from cadenza.codecs.codec import AudioCodec
from cadenza.codecs.dac import is_dac_directory, load_dac
from cadenza.codecs.embedded_encodec import is_embedded_encodec_directory, load_embedded_encodec
from cadenza.codecs.encodec import ENCODEC_24KHZ, load_encodec
from cadenza.codecs.mimi import is_mimi_directory, load_mimi
from cadenza.codecs.pocket_latent import (
    is_pocket_audio_tokenizer_directory,
    load_pocket_audio_tokenizer,
)
from cadenza.codecs.snac import SNAC_24KHZ, is_snac_directory, load_snac
from cadenza.hub_cache import resolve_checkpoint

BUILT_IN_CODECS = (ENCODEC_24KHZ, SNAC_24KHZ)


def load_codec(
    name_or_path: str = ENCODEC_24KHZ,
    device: str | torch.device = "cpu",
    seed: int = 0,
    noise: bool = True,
) -> AudioCodec:
    """``"encodec_24khz"`` or ``"snac_24khz"`` (random weights from ``seed``), or a checkpoint
    of EnCodec, SNAC, DAC (``model_type: "dac"``, descript/dac_44khz say), Mimi (a Mimi
    directory, or a Sesame CSM one for the Mimi inside it) or the Pocket TTS audio tokenizer
    (``model_type: "pocket_tts_audio_tokenizer"``: frames of continuous latents, their float32
    bit patterns as codes), or the EnCodec inside a MusicGen checkpoint (its
    ``audio_encoder``): a directory or a hub id in the local hub cache.
    ``noise``: SNAC's noise layers on (the model's behaviour) or off (reproducible audio).
    Raises :class:`~cadenza.codecs.codec.CodecError` for anything else."""
    if name_or_path in BUILT_IN_CODECS:
        directory = None
    else:
        directory = resolve_checkpoint(name_or_path, ("config.json",))
    if directory is not None and is_mimi_directory(directory):
        return load_mimi(str(directory), device=device, seed=seed)
    if directory is not None and is_pocket_audio_tokenizer_directory(directory):
        return load_pocket_audio_tokenizer(str(directory), device=device, seed=seed)
    if directory is not None and is_dac_directory(directory):
        return load_dac(str(directory), device=device, seed=seed)
    if directory is not None and is_embedded_encodec_directory(directory):
        return load_embedded_encodec(str(directory), device=device, seed=seed)
    if name_or_path == SNAC_24KHZ or (directory is not None and is_snac_directory(directory)):
        return load_snac(str(directory or name_or_path), device=device, seed=seed, noise=noise)
    return load_encodec(str(directory or name_or_path), device=device, seed=seed)
