"""Tiny random MusicGen checkpoints in the public layout (``facebook/musicgen-small``), and what
``transformers`` generates from them.

A checkpoint directory holds what the hub's does, with tiny sizes:

* ``config.json``: ``model_type: "musicgen"`` with the ``text_encoder`` (T5), ``audio_encoder``
  (EnCodec) and ``decoder`` sub-configs. The EnCodec has the 32 kHz model's structure and rates
  (32 000 Hz, ratios ``[8, 5, 4, 4]``: 640 samples a frame, 50 frames a second, non-causal
  convolutions, no normalisation, no conv shortcut, two LSTM layers) with tiny channels and
  :data:`CODEBOOK_SIZE` codes; its one bandwidth gives :data:`NUM_CODEBOOKS` codebooks. The T5
  (``d_model`` 32) and the decoder (hidden 64) differ in width, so ``enc_to_dec_proj`` exists
  as in musicgen-small (768 -> 1024).
* ``generation_config.json``: the published values (:data:`PUBLISHED_GENERATION`), with the
  special ids at the tiny vocabulary's end (:data:`SPECIAL_ID`) where the hub has 2048.
* ``model.safetensors``: ``text_encoder.*``, ``audio_encoder.*``, ``decoder.*``,
  ``enc_to_dec_proj.*``; the audio encoder's weight norm under the legacy names
  ``weight_g`` / ``weight_v`` as on the hub (or under today's names, on request).
* ``tokenizer.json`` and ``tokenizer_config.json`` (``tokenizer_class`` T5Tokenizer,
  ``processor_class`` MusicgenProcessor): a tiny T5 unigram tokenizer built offline. The hub
  also has the sentencepiece ``spiece.model`` and ``special_tokens_map.json``; without the
  ``sentencepiece`` package nothing here writes a ``spiece.model``, and ``transformers`` 5
  reads ``tokenizer.json``.
* ``preprocessor_config.json``: the EnCodec feature extractor's, as published.

The decoder's and projection's weights are drawn wider than ``transformers``' initialisation
(std :data:`WEIGHT_STD`) so that greedy choices are clear and depend on the text; the EnCodec
codebooks are drawn at random (``transformers`` leaves them at zero, so every code would decode
alike).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch
from transformers import (
    AutoProcessor,
    EncodecConfig,
    MusicgenConfig,
    MusicgenDecoderConfig,
    MusicgenForConditionalGeneration,
    T5Config,
    T5Tokenizer,
)

from tests.support.legacy_weight_norm import resave_with_legacy_weight_norm_names

SAMPLING_RATE = 32_000
UPSAMPLING_RATIOS = (8, 5, 4, 4)
HOP_LENGTH = math.prod(UPSAMPLING_RATIOS)  # 640 samples a frame
FRAME_RATE = SAMPLING_RATE // HOP_LENGTH  # 50 frames a second
NUM_CODEBOOKS = 4
CODEBOOK_SIZE = 64  # the hub's: 2048
SPECIAL_ID = CODEBOOK_SIZE  # pad = bos = decoder start; the hub's: 2048
# EnCodec derives its codebook count from its bandwidth: 4 * 50 * log2(64) bits/s = 1.2 kbps
# (the hub's: 4 * 50 * 11 = 2.2 kbps).
BANDWIDTH_KBPS = NUM_CODEBOOKS * FRAME_RATE * math.log2(CODEBOOK_SIZE) / 1000
WEIGHT_STD = 0.2

PUBLISHED_GENERATION: dict[str, Any] = {
    "bos_token_id": SPECIAL_ID,
    "decoder_start_token_id": SPECIAL_ID,
    "pad_token_id": SPECIAL_ID,
    "do_sample": True,
    "guidance_scale": 3.0,
    "max_length": 1500,  # 30 s at 50 frames a second
    "top_k": 250,
}

PREPROCESSOR_CONFIG: dict[str, Any] = {
    "chunk_length_s": None,
    "feature_extractor_type": "EncodecFeatureExtractor",
    "feature_size": 1,
    "overlap": None,
    "padding_side": "left",
    "padding_value": 0.0,
    "processor_class": "MusicgenProcessor",
    "return_attention_mask": True,
    "sampling_rate": SAMPLING_RATE,
}

# T5's layout: <pad> = 0, </s> = 1, <unk> = 2, then the pieces. Whole words score above the
# letters they spell, so they are chosen when they occur; any other ASCII text still tokenizes.
_SPECIAL_PIECES = ["<pad>", "</s>", "<unk>"]
_WORDS = (
    *("the", "and", "with", "a", "of", "in", "music", "song", "track", "beat", "drums", "drum"),
    *("guitar", "guitars", "bass", "synth", "piano", "jazz", "rock", "pop", "techno", "ambient"),
    *("calm", "slow", "fast", "loud", "soft", "happy", "sad", "heavy", "bassy", "groovy"),
    *("80s", "90s"),
)
_CHARACTERS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.,;:!?'\"-()"


def tiny_t5_vocab() -> list[tuple[str, float]]:
    """The tiny T5 tokenizer's unigram pieces and scores, in id order."""
    vocab: list[tuple[str, float]] = [(piece, 0.0) for piece in _SPECIAL_PIECES]
    vocab += [("▁" + word, -2.0) for word in _WORDS]
    vocab += [("▁", -3.0)]
    vocab += [("▁" + char, -4.0) for char in _CHARACTERS]
    vocab += [(char, -5.0) for char in _CHARACTERS]
    return vocab


def tiny_t5_tokenizer() -> T5Tokenizer:
    """A T5 tokenizer over :func:`tiny_t5_vocab` (no sentinel ``<extra_id_*>`` tokens): text
    -> pieces + ``</s>``, padding with ``<pad>`` (id 0) on the right, as t5-base does."""
    return T5Tokenizer(vocab=tiny_t5_vocab(), extra_ids=0, model_max_length=512)


def _t5_vocab_size() -> int:
    """The T5 embedding's rows: the pieces rounded up to a multiple of 32 (t5-base: 32 100
    pieces, 32 128 rows)."""
    return -(-len(tiny_t5_vocab()) // 32) * 32


def tiny_musicgen_config() -> MusicgenConfig:
    """musicgen-small's configuration with tiny widths (see the module's docstring)."""
    text_encoder = T5Config(
        vocab_size=_t5_vocab_size(),
        d_model=32,
        d_kv=8,
        d_ff=64,
        num_layers=2,
        num_decoder_layers=2,
        num_heads=4,
        relative_attention_num_buckets=32,
        relative_attention_max_distance=128,
        feed_forward_proj="relu",
        architectures=["T5ForConditionalGeneration"],
    )
    audio_encoder = EncodecConfig(
        sampling_rate=SAMPLING_RATE,
        upsampling_ratios=list(UPSAMPLING_RATIOS),
        target_bandwidths=[BANDWIDTH_KBPS],
        codebook_size=CODEBOOK_SIZE,
        num_filters=4,
        hidden_size=16,
        use_causal_conv=False,
        normalize=False,
        use_conv_shortcut=False,
        pad_mode="reflect",
        num_lstm_layers=2,
        trim_right_ratio=1.0,
        architectures=["EncodecModel"],
    )
    decoder = MusicgenDecoderConfig(
        vocab_size=CODEBOOK_SIZE,
        hidden_size=64,
        ffn_dim=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_codebooks=NUM_CODEBOOKS,
        max_position_embeddings=2048,
        pad_token_id=SPECIAL_ID,
        bos_token_id=SPECIAL_ID,
    )
    config = MusicgenConfig(text_encoder=text_encoder, audio_encoder=audio_encoder, decoder=decoder)
    config.architectures = ["MusicgenForConditionalGeneration"]
    return config


def build_tiny_musicgen(seed: int = 0) -> MusicgenForConditionalGeneration:
    """The tiny model, in eval mode, every weight and codebook drawn from ``seed`` (the same
    model on every machine; the global random state is left as it was)."""
    generator = torch.Generator().manual_seed(seed + 1)
    model: Any
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = MusicgenForConditionalGeneration(tiny_musicgen_config())
    with torch.no_grad():
        for module in (model.decoder, model.enc_to_dec_proj):
            for name, parameter in module.named_parameters():
                if name.endswith("weight") and parameter.dim() == 2:
                    parameter.normal_(0.0, WEIGHT_STD, generator=generator)
        for name, buffer in model.audio_encoder.quantizer.named_buffers():
            if name.endswith("codebook.embed"):
                buffer.copy_(torch.randn(buffer.shape, generator=generator))
    return model.eval()


def tiny_musicgen_checkpoint(
    directory: Path, *, seed: int = 0, legacy_weight_norm: bool = True
) -> Path:
    """Write a tiny random MusicGen checkpoint (:func:`build_tiny_musicgen` from ``seed``) in
    the public file layout to ``directory`` (created if need be); returns ``directory``.

    ``legacy_weight_norm``: the audio encoder's weight norm saved as ``<prefix>.weight_g`` /
    ``<prefix>.weight_v``, as facebook/musicgen-small publishes it, rather than
    ``<prefix>.parametrizations.weight.original0`` / ``original1`` as ``transformers`` saves
    it today. Nothing else in the file has weight norm.
    """
    directory.mkdir(parents=True, exist_ok=True)
    model = build_tiny_musicgen(seed)
    model.save_pretrained(directory)
    if legacy_weight_norm:
        resave_with_legacy_weight_norm_names(
            directory / "model.safetensors", lambda name: name.startswith("audio_encoder.")
        )
    tokenizer = tiny_t5_tokenizer()
    tokenizer.save_pretrained(directory)
    _patch_json(directory / "tokenizer_config.json", {"processor_class": "MusicgenProcessor"})
    _write_json(directory / "preprocessor_config.json", PREPROCESSOR_CONFIG)
    _write_json(directory / "generation_config.json", PUBLISHED_GENERATION)
    return directory


def _write_json(path: Path, values: dict[str, Any]) -> None:
    path.write_text(json.dumps(values, indent=2, sort_keys=True) + "\n")


def _patch_json(path: Path, values: dict[str, Any]) -> None:
    _write_json(path, {**json.loads(path.read_text()), **values})


def reference_musicgen_generate(
    directory: Path, texts: list[str], *, guidance_scale: float, max_new_tokens: int
) -> list[tuple[torch.Tensor, np.ndarray]]:
    """What ``transformers`` generates greedily for ``texts``, batched, the way a user calls
    it::

        processor = AutoProcessor.from_pretrained(directory)
        model = MusicgenForConditionalGeneration.from_pretrained(directory)
        inputs = processor(text=texts, padding=True, return_tensors="pt")
        audio = model.generate(**inputs, do_sample=False, guidance_scale=guidance_scale,
                               max_new_tokens=max_new_tokens)

    For each text, in order: its EnCodec codes (``LongTensor [NUM_CODEBOOKS, frames]``, the
    delay pattern undone: exactly what ``generate`` hands ``audio_encoder.decode``, with
    ``frames =`` :func:`frames_for` ``(max_new_tokens)``) and its audio (float32 mono
    ``[frames * HOP_LENGTH]`` at ``SAMPLING_RATE``, as ``generate`` returns it). There is no
    end-of-audio token: every text gets the same frame count, so nothing is padded.
    """
    processor = cast(Any, AutoProcessor).from_pretrained(directory)
    model: Any = MusicgenForConditionalGeneration.from_pretrained(directory)
    model.eval()
    inputs = processor(text=texts, padding=True, return_tensors="pt")
    captured: list[torch.Tensor] = []
    decode = model.audio_encoder.decode

    def capturing_decode(audio_codes: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        captured.append(audio_codes.clone())
        return decode(audio_codes, *args, **kwargs)

    model.audio_encoder.decode = capturing_decode
    try:
        with torch.no_grad():
            audio = model.generate(
                **inputs,
                do_sample=False,
                guidance_scale=guidance_scale,
                max_new_tokens=max_new_tokens,
            )
    finally:
        del model.audio_encoder.decode
    (codes,) = captured  # [1 chunk, batch, codebooks, frames]
    return [
        (codes[0, index].long(), audio[index, 0].float().numpy()) for index in range(len(texts))
    ]


def frames_for(max_new_tokens: int, num_codebooks: int = NUM_CODEBOOKS) -> int:
    """The frames ``generate`` returns for ``max_new_tokens``: the delay pattern costs
    ``num_codebooks - 1`` steps, so ``seconds * 50 + 3`` new tokens give ``seconds * 50``
    frames of four codebooks. Below ``2 * num_codebooks - 2`` new tokens ``transformers``
    applies no delay pattern at all (``build_delay_pattern_mask``'s early return) and every
    step is a frame: codes of another meaning, which no engine should reproduce."""
    if max_new_tokens + 1 < 2 * num_codebooks - 1:
        return max_new_tokens
    return max_new_tokens + 1 - num_codebooks


def max_new_tokens_for(frames: int, num_codebooks: int = NUM_CODEBOOKS) -> int:
    """The ``max_new_tokens`` for which ``generate`` returns ``frames`` frames."""
    return frames + num_codebooks - 1


__all__ = [
    "BANDWIDTH_KBPS",
    "CODEBOOK_SIZE",
    "FRAME_RATE",
    "HOP_LENGTH",
    "NUM_CODEBOOKS",
    "PUBLISHED_GENERATION",
    "SAMPLING_RATE",
    "SPECIAL_ID",
    "build_tiny_musicgen",
    "frames_for",
    "max_new_tokens_for",
    "reference_musicgen_generate",
    "tiny_musicgen_checkpoint",
    "tiny_musicgen_config",
    "tiny_t5_tokenizer",
    "tiny_t5_vocab",
]
