"""Tiny random Llama checkpoints, saved by transformers, for exactness tests."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

CONFIGS = {
    # name: (num_heads, num_kv_heads, tied, llama3 rope scaling)
    "mha": (4, 4, False, False),
    "gqa4-tied-llama3": (8, 2, True, True),
    "gqa3": (6, 2, False, False),
}


def save_tiny_llama(directory: Path, name: str, seed: int = 0) -> LlamaForCausalLM:
    heads, kv_heads, tied, llama3 = CONFIGS[name]
    rope = {"rope_type": "default", "rope_theta": 10000.0}
    if llama3:
        rope = {
            "rope_type": "llama3",
            "rope_theta": 500000.0,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 32,
        }
    config = LlamaConfig(
        vocab_size=256,
        hidden_size=96,
        intermediate_size=160,
        num_hidden_layers=2,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=96 // heads,
        max_position_embeddings=512,
        rope_parameters=rope,
        tie_word_embeddings=tied,
        initializer_range=0.2,  # spread logits: greedy ties are then vanishingly rare
        bos_token_id=1,
        eos_token_id=2,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).eval()
    model.save_pretrained(directory)
    return model


def hf_greedy(model: LlamaForCausalLM, prompt: list[int], max_new_tokens: int) -> list[int]:
    with torch.no_grad():
        out = model.generate(
            torch.tensor([prompt]),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            eos_token_id=2,
            pad_token_id=0,
        )
    return out[0, len(prompt) :].tolist()
