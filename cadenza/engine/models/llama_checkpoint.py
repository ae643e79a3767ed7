"""The Llama family: Hugging Face ``LlamaForCausalLM`` checkpoints (``model_type: "llama"``),
tied or untied embeddings, rotary scaling ``default`` or ``llama3``, single-file or sharded
safetensors. A ``cadenza.json`` beside ``config.json`` declares how its tokens spell audio
(:mod:`~cadenza.engine.models.audio_declaration`); without one it is a text LM. A declaration
may start from another family's (``{"preset": "orpheus", ...}``): that family recognises it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from cadenza.engine.models.audio_declaration import AudioLayoutConfig, declared, flat_audio
from cadenza.engine.models.audio_declaration import validated as validated_declaration
from cadenza.engine.models.checkpoint import CheckpointError, llama_backbone_config, load_weights
from cadenza.engine.models.family import ConfigJson, ModelFamily
from cadenza.engine.models.llama import LlamaBackboneConfig
from cadenza.engine.models.llama_causal_lm import LlamaForCausalLM


def is_llama_config(directory: Path, config: ConfigJson) -> bool:
    return config.get("model_type") == "llama"


def paged_backbone(directory: Path, config: ConfigJson) -> LlamaBackboneConfig:
    return llama_backbone_config(config, directory)


def load_llama(
    directory: Path, config: ConfigJson, device: torch.device, dtype: torch.dtype
) -> LlamaForCausalLM:
    """A Llama checkpoint, speaking what its ``cadenza.json`` declares (a text LM without)."""
    declaration = declared(directory)
    if declaration is not None and "preset" in declaration:
        raise CheckpointError(
            f"{directory / 'cadenza.json'}: unknown preset {declaration['preset']!r}"
        )
    layout = None if declaration is None else validated_declaration(directory, declaration)
    return load_llama_checkpoint(directory, config, device, dtype, layout)


def load_llama_checkpoint(
    directory: Path,
    config: ConfigJson,
    device: torch.device,
    dtype: torch.dtype,
    audio: AudioLayoutConfig | None,
) -> LlamaForCausalLM:
    """The weights of a Llama checkpoint in a :class:`LlamaForCausalLM` speaking ``audio``
    (``None``: a text LM); its heads restricted to the ids each row position may emit."""
    backbone = llama_backbone_config(config, directory)
    eos = config.get("eos_token_id")
    eos_ids = frozenset([eos] if isinstance(eos, int) else (eos or []))
    try:
        vocab_size = int(config["vocab_size"])
    except (KeyError, TypeError, ValueError) as exc:
        raise CheckpointError(f"{directory}: invalid vocab_size: {exc!r}") from exc
    tied = bool(config.get("tie_word_embeddings", False))
    speaks: dict[str, Any] = {} if audio is None else flat_audio(directory, audio, vocab_size)
    with torch.device("meta"):
        model = LlamaForCausalLM(
            backbone, vocab_size, tie_word_embeddings=tied, eos_ids=eos_ids, **speaks
        )
    state = {_hf_key(key): tensor for key, tensor in load_weights(directory).items()}
    if tied:
        state.pop("lm_head.weight", None)
    model.load_state_dict(state, strict=not tied, assign=True)
    if tied:
        model.lm_head.weight = model.embed_tokens.weight
    missing = [n for n, p in model.named_parameters() if p.is_meta]
    if missing:
        raise CheckpointError(f"{directory}: weights missing for {missing[:5]}")
    model.model.rotary = type(model.model.rotary)(
        backbone.head_dim, backbone.rope_theta, backbone.rope_llama3
    )
    model = model.to(device=device, dtype=dtype).eval()
    model.restrict_outputs()
    return model


def _hf_key(key: str) -> str:
    return key.removeprefix("model.") if key.startswith("model.embed_tokens") else key


FAMILY = ModelFamily(
    name="llama",
    summary="Llama checkpoints: a text LM, or speech as a cadenza.json declares it",
    recognises=is_llama_config,
    load=load_llama,
    paged_backbone=paged_backbone,
    restricted_outputs=True,
)
