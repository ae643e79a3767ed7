"""Tiny random Sesame CSM checkpoints in the public layout: a ``csm`` config with the real
special ids, codebook vocabulary (2051) and 32 codebooks, a tiny Mimi inside (codebooks drawn
at random: ``transformers`` leaves them at zero), a tokenizer whose special tokens sit at the
real ids, safetensors saved by ``transformers``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
from transformers import CsmConfig, CsmForConditionalGeneration, MimiConfig

from cadenza.codecs.mimi import randomize_codebooks

FIRST_SPECIAL = 128_000
TEXT_VOCAB = 128_256


def save_csm_tokenizer(directory: Path) -> Tokenizer:
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {char: index for index, char in enumerate(sorted(alphabet))}
    vocab.update({f"<fill_{i}>": i for i in range(len(vocab), FIRST_SPECIAL)})
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    names = [f"<|reserved_special_token_{i}|>" for i in range(TEXT_VOCAB - FIRST_SPECIAL)]
    names[:4] = ["<|begin_of_text|>", "<|end_of_text|>", "<|AUDIO|>", "<|audio_eos|>"]
    tokenizer.add_special_tokens([AddedToken(name, special=True) for name in names])
    tokenizer.save(str(directory / "tokenizer.json"))
    return tokenizer


def tiny_mimi_config() -> MimiConfig:
    return MimiConfig(
        hidden_size=64,
        num_filters=4,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=16,
        intermediate_size=64,
        codebook_dim=16,
        vector_quantization_hidden_dimension=16,
        num_quantizers=32,
        sliding_window=8,
        upsample_groups=64,
    )


def tiny_csm_config() -> CsmConfig:
    return CsmConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        initializer_range=0.2,  # spread logits: no greedy ties
        rope_parameters={
            "rope_type": "llama3",
            "rope_theta": 500000.0,
            "factor": 32.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
        },
        depth_decoder_config={
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 8,
            "backbone_hidden_size": 64,
            "max_position_embeddings": 33,
            "initializer_range": 0.2,
        },
        codec_config=tiny_mimi_config().to_dict(),
    )


def save_tiny_csm(directory: Path, seed: int = 0) -> CsmForConditionalGeneration:
    """Save a tiny CSM (and its tokenizer) to ``directory``; returns the reference model."""
    torch.manual_seed(seed)
    model = CsmForConditionalGeneration(tiny_csm_config()).eval()
    generator = torch.Generator().manual_seed(seed + 1)
    randomize_codebooks(model.codec_model, generator)
    with torch.no_grad():
        # The codebook embeddings are tied; a wider spread keeps greedy choices clear.
        model.depth_decoder.model.embed_tokens.weight.normal_(0.0, 0.5, generator=generator)
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory)
    save_csm_tokenizer(directory)
    return model


UNDECODABLE = [2048, 2049, 2050]  # past Mimi's codebook: cadenza never samples them


def reference_generate(
    model: CsmForConditionalGeneration,
    ids: list[int],
    frames: int,
    audio: np.ndarray | None = None,
    output_audio: bool = False,
) -> Any:
    """``transformers``' greedy generate for prompt ``ids`` (after a context turn's ``audio``,
    when given), with the ids the codec cannot decode suppressed as cadenza does. The mask is
    the processor's: without one, generate infers it from the pad id, which is also the audio
    token's id, and hides every audio position."""
    extra: dict[str, Any] = {"attention_mask": torch.ones(1, len(ids), dtype=torch.long)}
    if audio is not None:
        extra |= {
            "input_values": torch.from_numpy(audio)[None, None],
            "input_values_cutoffs": torch.tensor([[audio.size]]),
        }
    with torch.no_grad():
        return model.generate(
            input_ids=torch.tensor([ids]),
            max_new_tokens=frames,
            do_sample=False,
            depth_decoder_do_sample=False,
            suppress_tokens=UNDECODABLE,
            depth_decoder_suppress_tokens=UNDECODABLE,
            output_audio=output_audio,
            **extra,
        )


def reference_prompt_ids(directory: Path, text: str, speaker: str) -> list[int]:
    """The prompt ``transformers``' processor builds for one turn with no context."""
    tokenizer = Tokenizer.from_file(str(directory / "tokenizer.json"))
    rendered = f"<|begin_of_text|>[{speaker}]{text}<|end_of_text|>"
    return list(tokenizer.encode(rendered, add_special_tokens=False).ids)
