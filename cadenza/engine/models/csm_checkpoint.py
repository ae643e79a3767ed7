"""The Sesame CSM family (:mod:`~cadenza.engine.models.csm`): ``model_type: "csm"`` checkpoints
in the ``transformers`` layout, whose Mimi codec is in the same files (the codec loader reads
its weights from them)."""

from __future__ import annotations

from pathlib import Path

import torch
from pydantic import ValidationError

from cadenza.engine.models.audio_declaration import SamplingDefaults
from cadenza.engine.models.checkpoint import (
    CheckpointError,
    llama_backbone_config,
    load_weights,
    read_json,
    text_encoder,
)
from cadenza.engine.models.csm import (
    SPEAKERS,
    CsmModel,
    CsmPrompt,
    csm_sampling_defaults,
    is_csm_config,
    map_csm_key,
)
from cadenza.engine.models.family import ConfigJson, ModelFamily
from cadenza.engine.models.llama import LlamaBackboneConfig


def is_csm(directory: Path, config: ConfigJson) -> bool:
    return is_csm_config(config)


def paged_backbone(directory: Path, config: ConfigJson) -> LlamaBackboneConfig:
    """The backbone's shape (the depth decoder's KV is a per-frame scratch, not paged)."""
    return llama_backbone_config(config, directory, default_theta=500000.0)


def load_csm(
    directory: Path, config: ConfigJson, device: torch.device, dtype: torch.dtype
) -> CsmModel:
    """A Sesame CSM checkpoint in the ``transformers`` layout (the codec's weights stay for
    the codec loader)."""
    depth_config = config.get("depth_decoder_config")
    if not isinstance(depth_config, dict):
        raise CheckpointError(f"{directory}: a CSM config needs a depth_decoder_config object")
    backbone = llama_backbone_config(config, directory, default_theta=500000.0)
    depth = llama_backbone_config(depth_config, directory, default_theta=500000.0)
    try:
        num_codebooks = int(config.get("num_codebooks") or 32)
        vocab_size = int(config.get("vocab_size") or 2051)
        text_vocab_size = int(config.get("text_vocab_size") or 128256)
        eos_code = int(config.get("codebook_eos_token_id") or 0)
        codec = config.get("codec_config") or {}
        codebook_size = int(codec.get("codebook_size", 2048))
        backbone_hidden = int(depth_config.get("backbone_hidden_size", backbone.hidden_size))
        max_positions = int(config.get("max_position_embeddings") or 2048)
    except (TypeError, ValueError, AttributeError) as exc:
        raise CheckpointError(f"{directory}: invalid CSM config: {exc!r}") from exc
    if backbone_hidden != backbone.hidden_size:
        raise CheckpointError(f"{directory}: depth decoder and backbone widths disagree")
    try:
        encode_text = text_encoder(directory, "tokenizer.json", add_special_tokens=False)
        sampling = SamplingDefaults.model_validate(csm_sampling_defaults(directory)).params()
        with torch.device("meta"):
            model = CsmModel(
                backbone,
                depth,
                num_codebooks=num_codebooks,
                vocab_size=vocab_size,
                text_vocab_size=text_vocab_size,
                prompt=CsmPrompt(encode_text, num_codebooks, _csm_voices(directory)),
                codec_name=str(directory),
                default_sampling=sampling,
                codebook_size=codebook_size,
                eos_code=eos_code,
                max_positions=max_positions,
            )
    except (ValueError, OSError, ValidationError) as exc:
        raise CheckpointError(f"{directory}: {exc}") from exc
    state: dict[str, torch.Tensor] = {}
    for key, tensor in load_weights(directory).items():
        mapped = map_csm_key(key)
        if mapped is not None:
            state[mapped] = tensor
    # Codebook embeddings are tied between backbone and depth decoder (transformers saves one).
    backbone_key, depth_key = "embed_audio_tokens.weight", "depth_decoder.embed_tokens.weight"
    if config.get("tie_codebooks_embeddings", True):
        if backbone_key not in state and depth_key in state:
            state[backbone_key] = state[depth_key]
        elif depth_key not in state and backbone_key in state:
            state[depth_key] = state[backbone_key]
    try:
        model.load_state_dict(state, strict=True, assign=True)
    except RuntimeError as exc:
        raise CheckpointError(f"{directory}: weights do not fit the config: {exc}") from exc
    for module, config_of in (
        (model.backbone_model, backbone),
        (model.depth_decoder.transformer, depth),
    ):
        module.rotary = type(module.rotary)(
            config_of.head_dim, config_of.rope_theta, config_of.rope_llama3
        )
    model.offsets = torch.arange(num_codebooks) * vocab_size
    model.depth_decoder.split_heads()
    model = model.to(device=device, dtype=dtype).eval()
    # .to() converts each parameter on its own: tie the codebook embeddings again.
    model.depth_decoder.embed_tokens.weight = model.embed_audio_tokens.weight
    return model


def _csm_voices(directory: Path) -> tuple[str, ...]:
    """Speaker ids: ``cadenza.json``'s ``voices`` (ids as strings) if present, else 0 and 1."""
    path = directory / "cadenza.json"
    if not path.exists():
        return SPEAKERS
    voices = read_json(path).get("voices")
    if (
        not isinstance(voices, list)
        or not voices
        or not all(isinstance(v, str) and v.isdigit() for v in voices)
    ):
        raise CheckpointError(f'{path}: voices must be a list of speaker ids such as ["0"]')
    return tuple(voices)


FAMILY = ModelFamily(
    name="csm",
    summary="Sesame CSM (sesame/csm-1b): a Llama backbone and depth decoder speaking Mimi codes",
    recognises=is_csm,
    load=load_csm,
    paged_backbone=paged_backbone,
    depth_decoder=True,
    takes_context=True,
)
