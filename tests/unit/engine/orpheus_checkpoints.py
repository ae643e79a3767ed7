"""Tiny random Orpheus checkpoints in the public layout: a Llama config with the 156,940-id
vocabulary, a tokenizer whose special and ``<custom_token_N>`` entries sit at the real ids
(BOS 128000 added by its post-processor), safetensors saved by transformers."""

from __future__ import annotations

from pathlib import Path

import torch
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import LlamaConfig, LlamaForCausalLM, LogitsProcessor, PreTrainedTokenizerFast

from cadenza.contract.request import SynthesisRequest
from cadenza.engine.engine import Engine
from cadenza.engine.models import orpheus

VOCAB = 156_940
FIRST_SPECIAL = 128_000


def _special_names() -> list[str]:
    names = [f"<|reserved_special_token_{i}|>" for i in range(256)]
    names[0], names[1], names[9] = "<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>"
    return names + [f"<custom_token_{i}>" for i in range(VOCAB - FIRST_SPECIAL - 256)]


def save_tokenizer(directory: Path) -> PreTrainedTokenizerFast:
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {char: index for index, char in enumerate(sorted(alphabet))}
    vocab.update({f"<fill_{i}>": i for i in range(len(vocab), FIRST_SPECIAL)})
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens([AddedToken(name, special=True) for name in _special_names()])
    tokenizer.post_processor = processors.TemplateProcessing(
        single="<|begin_of_text|> $A", special_tokens=[("<|begin_of_text|>", FIRST_SPECIAL)]
    )
    tokenizer.save(str(directory / "tokenizer.json"))
    fast = PreTrainedTokenizerFast(tokenizer_file=str(directory / "tokenizer.json"))
    fast.save_pretrained(directory)
    return fast


def orpheus_config(
    max_positions: int = 1024, rope_original: int = 64, **shape: int | float
) -> LlamaConfig:
    """An Orpheus-shaped Llama config: the real vocabulary, special ids, tied embeddings and
    llama3 rotary scaling; ``shape`` sets the sizes (tiny by default)."""
    sizes = {
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
    }
    return LlamaConfig(
        vocab_size=VOCAB,
        max_position_embeddings=max_positions,
        rope_parameters={
            "rope_type": "llama3",
            "rope_theta": 500000.0,
            "factor": 32.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": rope_original,
        },
        tie_word_embeddings=True,
        bos_token_id=FIRST_SPECIAL,
        eos_token_id=orpheus.END_OF_SPEECH,
        **{**sizes, **shape},
    )


def save_tiny_orpheus(directory: Path, seed: int = 0) -> LlamaForCausalLM:
    config = orpheus_config(initializer_range=0.2)  # spread logits: no greedy ties
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).eval()
    model.save_pretrained(directory)
    save_tokenizer(directory)
    return model


def save_tiny_orpheus_and_snac(root: Path) -> tuple[Path, Path]:
    """``root/orpheus`` (a tiny Orpheus checkpoint) and ``root/snac`` (a small random SNAC in
    the ``snac`` package's layout): what a server serving Orpheus is pointed at."""
    import json

    from tests.unit.codecs.test_snac import SMALL, _reference

    orpheus_dir, snac_dir = root / "orpheus", root / "snac"
    orpheus_dir.mkdir()
    snac_dir.mkdir()
    save_tiny_orpheus(orpheus_dir)
    (snac_dir / "config.json").write_text(json.dumps(SMALL))
    torch.save(_reference(SMALL, seed=1).state_dict(), snac_dir / "pytorch_model.bin")
    return orpheus_dir, snac_dir


def reference_prompt(tokenizer: PreTrainedTokenizerFast, voice: str, text: str) -> list[int]:
    """The prompt as Canopy's package builds it."""
    return [
        orpheus.START_OF_HUMAN,
        *tokenizer(f"{voice}: {text}").input_ids,
        orpheus.END_OF_TEXT,
        orpheus.END_OF_HUMAN,
        orpheus.START_OF_AI,
        orpheus.START_OF_SPEECH,
    ]


class AudioPositionMask(LogitsProcessor):
    """The frame-position mask as a transformers logits processor: answer token ``i`` comes
    from position ``i % 7``'s id range (end of speech allowed at a frame boundary)."""

    def __init__(self, prompt_length: int) -> None:
        self.prompt_length = prompt_length

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        k = (input_ids.shape[1] - self.prompt_length) % orpheus.CODES_PER_FRAME
        start = orpheus.AUDIO_TOKEN_OFFSET + k * orpheus.CODEBOOK_SIZE
        allowed = torch.zeros_like(scores, dtype=torch.bool)
        allowed[:, start : start + orpheus.CODEBOOK_SIZE] = True
        if k == 0:
            allowed[:, orpheus.END_OF_SPEECH] = True
        return scores.masked_fill(~allowed, float("-inf"))


def reference_tokens(
    model: LlamaForCausalLM, prompt: list[int], new_tokens: int, repetition_penalty: float
) -> list[int]:
    with torch.no_grad():
        out = model.generate(
            torch.tensor([prompt]),
            max_new_tokens=new_tokens,
            do_sample=False,
            repetition_penalty=repetition_penalty,
            logits_processor=[AudioPositionMask(len(prompt))],
            eos_token_id=orpheus.END_OF_SPEECH,
            pad_token_id=0,
        )
    return out[0, len(prompt) :].tolist()


def reference_frames(tokens: list[int]) -> torch.Tensor:
    """Answer tokens -> SNAC codes ``[1, 7, frames]`` in the codec's level order."""
    frames = len(tokens) // orpheus.CODES_PER_FRAME
    codes = torch.zeros(1, orpheus.CODES_PER_FRAME, frames, dtype=torch.long)
    for f in range(frames):
        spelled = [
            tokens[f * 7 + k] - orpheus.AUDIO_TOKEN_OFFSET - k * orpheus.CODEBOOK_SIZE
            for k in range(7)
        ]
        # Orpheus spells L0, L1a, L2a, L2b, L1b, L2c, L2d
        codes[0, :, f] = torch.tensor([spelled[j] for j in orpheus.FRAME_ORDER])
    return codes


def run_to_the_end(engine: Engine, requests: list[SynthesisRequest]) -> dict[str, list[int]]:
    """Each request's generated ids (the first of each row), run until the engine is idle;
    the pool's integrity checked at the end."""
    seqs = {}
    for request in requests:
        engine.add_request(request)
        seqs[request.request_id] = engine.sequence(request.request_id)
    while engine.has_unfinished_requests():
        engine.step()
    engine.check_integrity()
    return {rid: [row[0] for row in seq.output_rows] for rid, seq in seqs.items()}
