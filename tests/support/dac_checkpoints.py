"""Small random DAC models built with ``transformers``, weight-normalised, and saved as
descript/dac_44khz publishes its weights (``model.safetensors``, legacy ``weight_g`` /
``weight_v`` names): the reference and the checkpoint of the DAC codec tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from transformers import DacConfig, DacModel

from tests.support.legacy_weight_norm import resave_with_legacy_weight_norm_names

SMALL_HOP = 16
SMALL_LOOKAHEAD = 177
"""Samples :func:`small_dac_config`'s decoder looks ahead, layer by layer, in output samples:
3 * 16 (first conv), (4 + 3 + 9 + 27) * 2 (the stride-8 block: transposed conv, residual
units), 1 + 39 (the stride-2 block), 3 (last conv)."""


def small_dac_config(**changes: Any) -> DacConfig:
    """Few channels and codebooks; upsampling ratios 8 then 2 (ratios the 44.1 kHz model has),
    a hop of :data:`SMALL_HOP` samples. ``changes``: fields set otherwise."""
    fields: dict[str, Any] = {
        "sampling_rate": 44100,
        "encoder_hidden_size": 8,
        "downsampling_ratios": [2, 8],
        "decoder_hidden_size": 32,
        "n_codebooks": 4,
        "codebook_size": 64,
        "codebook_dim": 8,
    }
    return DacConfig(**{**fields, **changes})


def dac_44khz_layout() -> DacConfig:
    """descript/dac_44khz's rates and codebooks (hop 512, 9 codebooks of 1024), narrow convs."""
    return DacConfig(
        sampling_rate=44100,
        encoder_hidden_size=2,
        downsampling_ratios=[2, 4, 8, 8],
        decoder_hidden_size=32,
        n_codebooks=9,
        codebook_size=1024,
    )


def random_dac(config: DacConfig, seed: int) -> DacModel:
    """A weight-normalised DAC from ``seed`` with the spread of a trained one's norms, Snake
    slopes and codebooks: its audio is loud (the library's initialisation, nearly equal
    values, decodes to near-silence, which would hide errors)."""
    torch.manual_seed(seed)
    model = DacModel(config).eval()
    model.apply_weight_norm()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith("original0") or name.endswith("alpha"):
                parameter.copy_(0.5 * torch.rand_like(parameter) + 0.5)
            elif name.endswith("codebook.weight"):
                parameter.normal_()
    return model


def save_legacy_checkpoint(model: DacModel, directory: Path) -> Path:
    """``model`` saved to ``directory``, its weight norm under the legacy names; returns
    ``directory``."""
    model.save_pretrained(directory)
    assert resave_with_legacy_weight_norm_names(directory / "model.safetensors") > 0
    return directory
