"""A model family added the way every family is: this module, and one line in the registry's
table (``cadenza.engine.models.registry.FAMILIES``). A Llama variant whose checkpoints say
``"architectures": ["LlamaCodesForSpeech"]`` and speak EnCodec frames of eight codebooks of 16
codes, ids 100-227 of their vocabulary (end of speech: id 2): a restricted id range, so its
head computes only the logits a token position may emit (docs/architecture.md quotes it)."""

from __future__ import annotations

from pathlib import Path

import torch

from cadenza.engine.models.audio_declaration import validated
from cadenza.engine.models.checkpoint import llama_backbone_config
from cadenza.engine.models.family import ConfigJson, ModelFamily
from cadenza.engine.models.llama import LlamaBackboneConfig
from cadenza.engine.models.llama_causal_lm import LlamaForCausalLM
from cadenza.engine.models.llama_checkpoint import load_llama_checkpoint

CODES = {"num_codebooks": 8, "codebook_size": 16, "audio_token_offset": 100, "audio_eos_id": 2}


def recognises(directory: Path, config: ConfigJson) -> bool:
    return config.get("architectures") == ["LlamaCodesForSpeech"]


def load(
    directory: Path, config: ConfigJson, device: torch.device, dtype: torch.dtype
) -> LlamaForCausalLM:
    speech = {"family": "llama-codes", "layout": "flat", "codec": "encodec_24khz", **CODES}
    return load_llama_checkpoint(directory, config, device, dtype, validated(directory, speech))


def paged_backbone(directory: Path, config: ConfigJson) -> LlamaBackboneConfig:
    return llama_backbone_config(config, directory)


FAMILY = ModelFamily(
    name="llama-codes",
    summary="a Llama speaking eight codebooks of 16 codes at ids 100-227",
    recognises=recognises,
    load=load,
    paged_backbone=paged_backbone,
    restricted_outputs=True,
)
