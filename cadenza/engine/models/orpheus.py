"""Orpheus (canopylabs/orpheus-3b-0.1-ft and its fine-tunes): a Llama 3 checkpoint that speaks
SNAC 24 kHz codes, recognised from its own files.

* Prompt: ``[start_of_human] + tokenizer("{voice}: {text}") + [end_of_text, end_of_human,
  start_of_ai, start_of_speech]``, the tokenizer adding its BOS. Voice and text are tokenized
  together, as the model was trained.
* Audio: token ``i`` of the answer is position ``k = i % 7`` of a SNAC frame, id ``128266 +
  k * 4096 + code``; the positions are ``L0[i], L1[2i], L2[4i], L2[4i+1], L1[2i+1], L2[4i+2],
  L2[4i+3]``. ``end_of_speech`` (128258) ends the answer at a frame boundary.
* Sampling defaults: the checkpoint's ``generation_config.json`` where it sets them, else the
  values of Canopy's own package (temperature 0.6, top-p 0.8, repetition penalty 1.3).
* Recognised from its tokenizer (the first audio token's name at its id), or declared by a
  ``cadenza.json`` of ``{"preset": "orpheus", ...}`` whose other fields override these.
* Output ids: a token may only be its frame position's code (or the end of speech at a frame's
  start): the head computes 4,097 of the 156,940 logits per token.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from cadenza.engine.models.audio_declaration import declared, validated
from cadenza.engine.models.checkpoint import llama_backbone_config
from cadenza.engine.models.family import ConfigJson, ModelFamily
from cadenza.engine.models.llama import LlamaBackboneConfig
from cadenza.engine.models.llama_causal_lm import LlamaForCausalLM
from cadenza.engine.models.llama_checkpoint import is_llama_config, load_llama_checkpoint

START_OF_HUMAN = 128259
END_OF_TEXT = 128009
END_OF_HUMAN = 128260
START_OF_AI = 128261
START_OF_SPEECH = 128257
END_OF_SPEECH = 128258
AUDIO_TOKEN_OFFSET = 128266
CODEBOOK_SIZE = 4096
CODES_PER_FRAME = 7
FRAME_ORDER = [0, 1, 4, 2, 3, 5, 6]  # codec code j is token FRAME_ORDER[j] of a frame
VOICES = ["tara", "leah", "jess", "leo", "dan", "mia", "zac", "zoe"]
SNAC_CODEC = "hubertsiuzdak/snac_24khz"
SAMPLING_DEFAULTS = {"temperature": 0.6, "top_p": 0.8, "repetition_penalty": 1.3}
_FIRST_AUDIO_TOKEN = "<custom_token_10>"


def is_orpheus_checkpoint(directory: Path, config: dict[str, Any]) -> bool:
    """A Llama config whose vocabulary holds the audio range, with a tokenizer that names
    the first audio token ``<custom_token_10>`` at id 128266."""
    vocab = config.get("vocab_size")
    if not isinstance(vocab, int) or vocab < AUDIO_TOKEN_OFFSET + CODES_PER_FRAME * CODEBOOK_SIZE:
        return False
    try:
        tokenizer = json.loads((directory / "tokenizer.json").read_text())
    except (OSError, ValueError):
        return False
    added = tokenizer.get("added_tokens") if isinstance(tokenizer, dict) else None
    return any(
        isinstance(token, dict)
        and token.get("id") == AUDIO_TOKEN_OFFSET
        and token.get("content") == _FIRST_AUDIO_TOKEN
        for token in added or []
    )


def orpheus_audio_config(directory: Path) -> dict[str, Any]:
    """The ``cadenza.json`` an Orpheus checkpoint would have: what
    :class:`~cadenza.engine.models.audio_declaration.AudioLayoutConfig` validates."""
    return {
        "family": "orpheus",
        "layout": "flat",
        "codec": SNAC_CODEC,
        "num_codebooks": CODES_PER_FRAME,
        "codebook_size": CODEBOOK_SIZE,
        "audio_token_offset": AUDIO_TOKEN_OFFSET,
        "audio_eos_id": END_OF_SPEECH,
        "frame_order": FRAME_ORDER,
        "text_tokenizer": "tokenizer.json",
        "add_special_tokens": True,
        "prompt_template": "{voice}: {text}",
        "prompt_prefix_ids": [START_OF_HUMAN],
        "prompt_suffix_ids": [END_OF_TEXT, END_OF_HUMAN, START_OF_AI, START_OF_SPEECH],
        "voices": VOICES,
        "sampling": {**SAMPLING_DEFAULTS, **_generation_config_sampling(directory)},
    }


def _generation_config_sampling(directory: Path) -> dict[str, float]:
    try:
        config = json.loads((directory / "generation_config.json").read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(config, dict) or not config.get("do_sample", True):
        return {}
    keys = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")
    return {k: config[k] for k in keys if isinstance(config.get(k), (int, float))}


def is_orpheus(directory: Path, config: ConfigJson) -> bool:
    """A Llama checkpoint that declares the preset, or has Orpheus's own files."""
    if not is_llama_config(directory, config):
        return False
    declaration = declared(directory)
    if declaration is not None:
        return declaration.get("preset") == "orpheus"
    return is_orpheus_checkpoint(directory, config)


def load_orpheus(
    directory: Path, config: ConfigJson, device: torch.device, dtype: torch.dtype
) -> LlamaForCausalLM:
    overrides = {k: v for k, v in (declared(directory) or {}).items() if k != "preset"}
    audio = validated(directory, {**orpheus_audio_config(directory), **overrides})
    return load_llama_checkpoint(directory, config, device, dtype, audio)


def paged_backbone(directory: Path, config: ConfigJson) -> LlamaBackboneConfig:
    return llama_backbone_config(config, directory)


FAMILY = ModelFamily(
    name="orpheus",
    summary="canopylabs/orpheus-3b-0.1-ft and fine-tunes: Llama 3 speaking SNAC 24 kHz codes",
    recognises=is_orpheus,
    load=load_orpheus,
    paged_backbone=paged_backbone,
    restricted_outputs=True,
)
