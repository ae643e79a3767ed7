"""A Bark checkpoint in the ``transformers`` layout (``suno/bark``, ``suno/bark-small``):
``config.json`` with ``model_type: "bark"`` and the semantic, coarse, fine and codec
sub-configs, the weights (``semantic.*``, ``coarse_acoustics.*``, ``fine_acoustics.*``,
``codec_model.*``) in safetensors, ``generation_config.json``, the BERT tokenizer's files and
the voice presets (:mod:`~cadenza.engine.models.bark.bark_voices`). The codec inside is loaded
as a codec (:mod:`~cadenza.codecs.embedded_encodec`): the model names its directory as its
codec, as a MusicGen does."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file
from transformers import AutoTokenizer

from cadenza.engine.models.bark.bark_constants import BarkConstants, bark_constants
from cadenza.engine.models.bark.bark_gpt import BarkCausalGPT, BarkFineGPT, GPTShape
from cadenza.engine.models.bark.bark_voices import VoicePreset, load_voice_presets
from cadenza.engine.models.checkpoint import CheckpointError, read_json

_STAGES = ("semantic_config", "coarse_acoustics_config", "fine_acoustics_config", "codec_config")


@dataclass
class BarkCheckpoint:
    """A loaded Bark: the three stages, the tokenizer, voices and constants."""

    semantic: BarkCausalGPT
    coarse: BarkCausalGPT
    fine: BarkFineGPT
    tokenizer: Any
    voices: dict[str, VoicePreset]
    constants: BarkConstants
    name: str

    def text_ids(self, text: str) -> list[int]:
        """The tokenizer's ids for ``text`` (no special tokens), as the semantic stage reads
        them: the first ``max_input_semantic_length``."""
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        return list(ids)[: self.constants.max_input_semantic_length]


def _stage_weights(weights: dict[str, torch.Tensor], prefix: str) -> dict[str, torch.Tensor]:
    return {
        name[len(prefix) :]: tensor for name, tensor in weights.items() if name.startswith(prefix)
    }


def _load_into(module: torch.nn.Module, weights: dict[str, torch.Tensor], what: str) -> None:
    expected = set(module.state_dict())
    missing = sorted(expected - set(weights))
    if missing:
        raise CheckpointError(f"{what}: weights missing: {', '.join(missing[:5])}")
    module.load_state_dict({name: weights[name] for name in expected})


def _fine_weights(weights: dict[str, torch.Tensor], heads: int) -> dict[str, torch.Tensor]:
    """The fine stage's weights; a head saved tied to its embedding reads that embedding."""
    fine = _stage_weights(weights, "fine_acoustics.")
    for index in range(heads):
        head = f"lm_heads.{index}.weight"
        if head not in fine and f"input_embeds_layers.{index + 1}.weight" in fine:
            fine[head] = fine[f"input_embeds_layers.{index + 1}.weight"]
    return fine


def load_bark(directory: Path, device: torch.device, dtype: torch.dtype) -> BarkCheckpoint:
    """The checkpoint in ``directory`` with its weights loaded, in eval mode. Raises
    :class:`CheckpointError` naming what is missing or invalid."""
    config = read_json(directory / "config.json")
    if config.get("model_type") != "bark":
        raise CheckpointError(f"{directory}: not a Bark checkpoint (model_type bark)")
    absent = [key for key in _STAGES if not isinstance(config.get(key), dict)]
    if absent:
        raise CheckpointError(f"{directory}: config.json lacks {', '.join(absent)}")
    generation_path = directory / "generation_config.json"
    try:
        constants = bark_constants(read_json(generation_path) if generation_path.exists() else None)
        shapes = {key: GPTShape.from_config(config[key]) for key in _STAGES[:3]}
    except (KeyError, TypeError, ValueError) as error:
        raise CheckpointError(f"{directory}: {error}") from error
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"{directory}: no *.safetensors weights")
    weights: dict[str, torch.Tensor] = {}
    for path in files:
        weights.update(load_file(path))
    fine_config = config["fine_acoustics_config"]
    n_total = int(fine_config.get("n_codes_total", constants.n_fine_codebooks))
    n_given = int(fine_config.get("n_codes_given", 1))
    if n_total != constants.n_fine_codebooks:
        raise CheckpointError(f"{directory}: fine n_codes_total {n_total} != n_fine_codebooks")
    semantic = BarkCausalGPT(shapes["semantic_config"])
    coarse = BarkCausalGPT(shapes["coarse_acoustics_config"])
    fine = BarkFineGPT(shapes["fine_acoustics_config"], n_total, n_given)
    _load_into(semantic, _stage_weights(weights, "semantic."), "semantic")
    _load_into(coarse, _stage_weights(weights, "coarse_acoustics."), "coarse")
    _load_into(fine, _fine_weights(weights, n_total - n_given), "fine")
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(directory))
    except (OSError, ValueError) as error:
        raise CheckpointError(f"{directory}: no usable tokenizer: {error}") from error
    voices = load_voice_presets(
        directory, constants.n_coarse_codebooks, constants.n_fine_codebooks, constants.codebook_size
    )
    for module in (semantic, coarse, fine):
        module.to(device=device, dtype=dtype).eval()
    return BarkCheckpoint(semantic, coarse, fine, tokenizer, voices, constants, name=directory.name)
