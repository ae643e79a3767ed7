"""Tiny random Dia checkpoints in the public layout of ``nari-labs/Dia-1.6B-0626`` (the
``transformers`` format), a tiny random DAC codec beside them, and ``transformers``' greedy generate
with classifier-free guidance as the reference.

A checkpoint directory holds what the hub's does: ``config.json`` (``model_type`` ``"dia"``, an
``encoder_config`` and a ``decoder_config``), ``generation_config.json`` with the published
generation values, ``model.safetensors``, the byte tokenizer's ``tokenizer_config.json`` and
``special_tokens_map.json``, the feature extractor's ``preprocessor_config.json`` and
``audio_tokenizer_config.json`` naming the codec (``DacModel`` at ``descript/dac_44khz`` on the
hub). The audio ids are the real ones (codebooks of 1024 codes; end of audio 1024, pad 1025,
start 1026; vocabulary 1028) and so are the delay pattern, the sampling rate (44.1 kHz) and the
hop (512 samples a frame): only the widths and depths are small."""

from __future__ import annotations

import json
import math
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from safetensors import safe_open
from transformers import (
    DacConfig,
    DacModel,
    DiaConfig,
    DiaFeatureExtractor,
    DiaForConditionalGeneration,
    DiaProcessor,
    DiaTokenizer,
    GenerationConfig,
)

from tests.support.legacy_weight_norm import resave_with_legacy_weight_norm_names

DELAY_PATTERN = (0, 8, 9, 10, 11, 12, 13, 14, 15)
NUM_CHANNELS = len(DELAY_PATTERN)
CODEBOOK_SIZE = 1024
AUDIO_EOS = 1024
AUDIO_PAD = 1025
AUDIO_BOS = 1026
AUDIO_VOCAB = 1028
TEXT_VOCAB = 256
SAMPLING_RATE = 44_100
HOP_LENGTH = 512
DAC_HUB_ID = "descript/dac_44khz"

PUBLISHED_GENERATION: dict[str, Any] = {
    "bos_token_id": AUDIO_BOS,
    "do_sample": True,
    "eos_token_id": AUDIO_EOS,
    "guidance_scale": 3.0,
    "max_length": 3072,
    "pad_token_id": AUDIO_PAD,
    "temperature": 1.8,
    "top_k": 50,
    "top_p": 0.9,
}
"""``generation_config.json`` of ``nari-labs/Dia-1.6B-0626``: sampling at temperature 1.8 with
top-p 0.9; ``top_k`` (50) is also the guidance top-k filter, which applies when decoding greedily
too."""

SNAPSHOT_COMMIT = "d1a" + "0" * 37

WeightNorm = Literal["folded", "parametrizations", "legacy"]


def tiny_dac_config() -> DacConfig:
    """DAC at 44.1 kHz with the real hop (2 x 4 x 8 x 8 = 512 samples), nine codebooks of 1024
    codes and narrow convolutions."""
    return DacConfig(
        encoder_hidden_size=4,
        downsampling_ratios=[2, 4, 8, 8],
        decoder_hidden_size=32,
        n_codebooks=NUM_CHANNELS,
        codebook_size=CODEBOOK_SIZE,
        codebook_dim=4,
        sampling_rate=SAMPLING_RATE,
    )


def tiny_dia_config() -> DiaConfig:
    """Dia with two encoder and two decoder layers of width 32: grouped-query self-attention in
    the decoder (4 query heads, 2 key/value heads, as the real 16/4), plain multi-head
    cross-attention (4/4, as the real 16/16), real ids, channels and delay pattern."""
    return DiaConfig(
        encoder_config={
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 4,
            "head_dim": 8,
            "vocab_size": TEXT_VOCAB,
            "max_position_embeddings": 1024,
            "initializer_range": 0.2,
        },
        decoder_config={
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 8,
            "cross_num_attention_heads": 4,
            "cross_num_key_value_heads": 4,
            "cross_head_dim": 8,
            "cross_hidden_size": 32,
            "vocab_size": AUDIO_VOCAB,
            "num_channels": NUM_CHANNELS,
            "max_position_embeddings": 3072,
            "initializer_range": 0.2,
            "bos_token_id": AUDIO_BOS,
            "eos_token_id": AUDIO_EOS,
            "pad_token_id": AUDIO_PAD,
        },
        delay_pattern=list(DELAY_PATTERN),
        initializer_range=0.2,
    )


def save_tiny_dac(directory: Path, *, seed: int = 0, weight_norm: WeightNorm = "folded") -> Path:
    """Save a tiny random :class:`DacModel` (:func:`tiny_dac_config`, codebooks drawn from a unit
    normal) to ``directory`` (``config.json``, ``model.safetensors``); returns ``directory``.

    ``weight_norm``: ``"folded"``, plain ``<conv>.weight`` tensors, as ``descript/dac_44khz``
    holds them (its conversion removes the weight norm before saving) and the only form
    ``transformers``' ``DacModel`` loads; ``"parametrizations"``, the same convolutions under
    weight norm as today's torch saves it (``<conv>.parametrizations.weight.original0`` /
    ``original1``); ``"legacy"``, under ``<conv>.weight_g`` / ``<conv>.weight_v``. The three
    hold the same function (to float32 rounding) for one ``seed``."""
    torch.manual_seed(seed)
    model = DacModel(tiny_dac_config()).eval()
    generator = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for quantizer in model.quantizer.quantizers:
            quantizer.codebook.weight.normal_(0.0, 1.0, generator=generator)
    if weight_norm != "folded":
        model.apply_weight_norm()
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory)
    if weight_norm == "legacy":
        resave_with_legacy_weight_norm_names(directory / "model.safetensors")
    return directory


def weight_norm_form(directory: Path) -> WeightNorm:
    """Which form of :func:`save_tiny_dac` the codec checkpoint at ``directory`` is in."""
    with safe_open(directory / "model.safetensors", "pt") as handle:
        names = list(handle.keys())
    if any(name.endswith(".weight_g") for name in names):
        return "legacy"
    if any(".parametrizations." in name for name in names):
        return "parametrizations"
    return "folded"


def hub_cache_snapshot(cache: Path, repo_id: str, source: Path) -> Path:
    """Copy the files of ``source`` into the Hugging Face hub cache ``cache`` as the ``main``
    snapshot of ``repo_id`` (``models--owner--name/snapshots/<commit>``, ``refs/main``); returns
    the snapshot directory."""
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    snapshot = repo / "snapshots" / SNAPSHOT_COMMIT
    snapshot.mkdir(parents=True, exist_ok=True)
    for path in source.iterdir():
        shutil.copy2(path, snapshot / path.name)
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text(SNAPSHOT_COMMIT)
    return snapshot


def codec_directory(directory: Path) -> Path:
    """Where :func:`tiny_dia_checkpoint` saves the codec of the checkpoint at ``directory`` when
    no hub cache is named: the sibling ``<name>-dac``."""
    return directory.parent / f"{directory.name}-dac"


_ENCODER_KEYS = (
    "head_dim",
    "hidden_act",
    "hidden_size",
    "initializer_range",
    "intermediate_size",
    "max_position_embeddings",
    "model_type",
    "norm_eps",
    "num_attention_heads",
    "num_hidden_layers",
    "num_key_value_heads",
    "vocab_size",
)
_DECODER_KEYS = (
    *_ENCODER_KEYS,
    "cross_head_dim",
    "cross_hidden_size",
    "cross_num_attention_heads",
    "cross_num_key_value_heads",
    "num_channels",
)


def hub_config_json(config: DiaConfig) -> dict[str, Any]:
    """``config.json`` of ``config`` in the form ``transformers`` 4.53 wrote for the hub:
    ``rope_theta`` and ``rope_scaling`` in each sub-config, the audio ids (start, end, pad) at
    the top level only, ``torch_dtype``."""

    def sub(part: Any, keys: tuple[str, ...]) -> dict[str, Any]:
        values = {key: getattr(part, key) for key in keys}
        rope = part.rope_parameters
        return dict(
            sorted({**values, "rope_theta": rope["rope_theta"], "rope_scaling": None}.items())
        )

    return {
        "architectures": ["DiaForConditionalGeneration"],
        "bos_token_id": config.decoder_config.bos_token_id,
        "decoder_config": sub(config.decoder_config, _DECODER_KEYS),
        "delay_pattern": list(config.delay_pattern),
        "encoder_config": sub(config.encoder_config, _ENCODER_KEYS),
        "eos_token_id": config.decoder_config.eos_token_id,
        "initializer_range": config.initializer_range,
        "is_encoder_decoder": True,
        "model_type": "dia",
        "norm_eps": config.norm_eps,
        "pad_token_id": config.decoder_config.pad_token_id,
        "torch_dtype": "float32",
        "transformers_version": "4.53.0.dev0",
        "use_cache": True,
    }


def _save_processor_files(directory: Path, codec: str) -> None:
    DiaFeatureExtractor(sampling_rate=SAMPLING_RATE, hop_length=HOP_LENGTH).save_pretrained(
        directory
    )
    DiaTokenizer().save_pretrained(directory)
    for name in ("preprocessor_config.json", "tokenizer_config.json"):
        path = directory / name
        data = json.loads(path.read_text())
        data["processor_class"] = "DiaProcessor"
        path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    special = {"pad_token": "<pad>", "unk_token": "<pad>"}
    (directory / "special_tokens_map.json").write_text(json.dumps(special, indent=2) + "\n")
    reference = {"audio_tokenizer_class": "DacModel", "audio_tokenizer_name_or_path": codec}
    (directory / "audio_tokenizer_config.json").write_text(json.dumps(reference, indent=2) + "\n")


def tiny_dia_checkpoint(
    directory: Path,
    *,
    seed: int = 0,
    legacy_names: bool = False,
    hub_cache: Path | None = None,
    codec_weight_norm: WeightNorm = "folded",
    eos_scale: float = 1.0,
) -> Path:
    """Save a tiny random Dia checkpoint to ``directory`` in the public file layout, and its
    codec; returns ``directory``.

    The codec (:func:`save_tiny_dac` with ``codec_weight_norm``, seed ``seed + 7``) goes to
    :func:`codec_directory`, and ``audio_tokenizer_config.json`` names that directory's absolute
    path; with ``hub_cache``, it goes into that hub cache as the snapshot of
    ``descript/dac_44khz`` (:func:`hub_cache_snapshot`) and ``audio_tokenizer_config.json``
    names ``descript/dac_44khz``, exactly as the public checkpoint does.

    ``legacy_names``: ``config.json`` as the hub's file spells it (:func:`hub_config_json`:
    ``rope_theta``, the audio ids at the top level) rather than as ``transformers`` 5 saves it
    (``rope_parameters``, the ids in ``decoder_config``); both load to the same model.

    ``eos_scale``: the head's end-of-audio row of channel 0 multiplied by it. At 1 a random model
    almost never ends a stream by itself, so streams run to ``max_new_tokens``; at 2 (seed 0)
    streams end by themselves after different numbers of steps, some at the first step (no
    frames at all), some not before ``max_new_tokens``."""
    torch.manual_seed(seed)
    config = tiny_dia_config()
    model = DiaForConditionalGeneration(config).eval()
    with torch.no_grad():
        model.logits_dense.weight[AUDIO_EOS] *= eos_scale
    model.generation_config = GenerationConfig(**PUBLISHED_GENERATION)
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory)
    if legacy_names:
        hub_config = hub_config_json(config)
        (directory / "config.json").write_text(json.dumps(hub_config, indent=2) + "\n")
    generation = {**PUBLISHED_GENERATION, "transformers_version": "4.53.0.dev0"}
    (directory / "generation_config.json").write_text(
        json.dumps(generation, indent=2, sort_keys=True) + "\n"
    )

    codec = codec_directory(directory)
    save_tiny_dac(codec, seed=seed + 7, weight_norm=codec_weight_norm)
    if hub_cache is None:
        _save_processor_files(directory, str(codec.resolve()))
    else:
        hub_cache_snapshot(hub_cache, DAC_HUB_ID, codec)
        shutil.rmtree(codec)
        _save_processor_files(directory, DAC_HUB_ID)
    return directory


def codec_location(directory: Path, hub_cache: Path | None = None) -> Path:
    """The codec directory the checkpoint at ``directory`` names in
    ``audio_tokenizer_config.json``: the directory itself, or a hub id's ``main`` snapshot in
    ``hub_cache``."""
    reference = json.loads((directory / "audio_tokenizer_config.json").read_text())
    name = reference["audio_tokenizer_name_or_path"]
    if Path(name).is_dir():
        return Path(name)
    if hub_cache is None:
        raise FileNotFoundError(f"{name!r} names a hub id and no hub cache was given")
    repo = hub_cache / ("models--" + name.replace("/", "--"))
    return repo / "snapshots" / (repo / "refs" / "main").read_text().strip()


def load_reference(
    directory: Path, hub_cache: Path | None = None
) -> tuple[DiaProcessor, DiaForConditionalGeneration]:
    """The processor (with its codec) and the model, as a user loads them, offline; a codec named
    by hub id is looked up in ``hub_cache``. Raises :class:`ValueError` for a codec saved under
    weight norm, which ``transformers``' ``DacModel`` would load with random convolutions."""
    form = weight_norm_form(codec_location(directory, hub_cache))
    if form != "folded":
        raise ValueError(f"transformers cannot load a DAC saved under weight norm ({form})")
    extra: dict[str, Any] = {"local_files_only": True}
    if hub_cache is not None:
        extra["cache_dir"] = str(hub_cache)
    processor = DiaProcessor.from_pretrained(str(directory), **extra)
    model = DiaForConditionalGeneration.from_pretrained(str(directory), local_files_only=True)
    return processor, model.eval()


def generated_codes(
    sequences: torch.Tensor, audio_prompt_len: int | None = None
) -> list[torch.Tensor]:
    """The codes ``DiaProcessor.batch_decode`` hands the codec, one ``LongTensor[9, frames]``
    per stream, from ``generate``'s delayed ``sequences`` ``[batch, steps, 9]``: the delay
    reverted, from the first frame after the start rows (or ``audio_prompt_len``) up to the
    stream's end of audio."""
    batch, steps, channels = sequences.shape
    if audio_prompt_len is not None:
        starts = [audio_prompt_len] * batch
    else:
        starts = (sequences[:, :, 0] == AUDIO_BOS).sum(dim=-1).tolist()
    ends = (steps - (sequences[:, :, 0] == AUDIO_PAD).sum(dim=-1) - 1).tolist()
    indices = DiaProcessor.build_indices(batch, steps, channels, list(DELAY_PATTERN), revert=True)
    reverted = DiaProcessor.apply_audio_delay(sequences, -1, -1, indices).transpose(1, 2)
    return [reverted[i, :, starts[i] : ends[i]].long().clone() for i in range(batch)]


def reference_dia_generate(
    directory: Path,
    texts: list[str],
    *,
    guidance_scale: float,
    max_new_tokens: int,
    audio_prompt: Sequence[np.ndarray] | None = None,
    hub_cache: Path | None = None,
) -> list[tuple[torch.Tensor, np.ndarray]]:
    """``transformers``' greedy generate for ``texts`` as one batch, as a user calls it:
    ``processor(text=texts, audio=audio_prompt)``, ``model.generate(**inputs, do_sample=False,
    guidance_scale=guidance_scale, max_new_tokens=max_new_tokens)``, then
    ``processor.batch_decode`` (past the audio prompt when there is one). One
    ``(codes LongTensor[9, frames], audio float32 [samples])`` per text: the codes the codec
    decodes and the waveform it gives (44.1 kHz, ``512 * frames`` samples). A stream that ends
    at its first step has no frames and no samples (:func:`decode_codes`).

    ``audio_prompt``: one mono 44.1 kHz clip per text, whose transcript the text must begin
    with (voice cloning). ``hub_cache``: where a codec named by hub id is cached.
    ``max_new_tokens`` must exceed the largest delay (15): with fewer steps no stream is ended and
    ``batch_decode`` would hand the codec the delay's fill; ``max_new_tokens - 16`` frames at
    most come out of a stream."""
    if max_new_tokens <= max(DELAY_PATTERN):
        raise ValueError(f"max_new_tokens must exceed {max(DELAY_PATTERN)}, got {max_new_tokens}")
    processor, model = load_reference(directory, hub_cache)
    call: dict[str, Any] = {"text": texts, "padding": True, "return_tensors": "pt"}
    if audio_prompt is not None:
        call |= {"audio": list(audio_prompt), "sampling_rate": SAMPLING_RATE}
    inputs = processor(**call)
    prompt_len = None
    if audio_prompt is not None:
        prompt_len = processor.get_audio_prompt_len(inputs["decoder_attention_mask"])
    with torch.no_grad():
        sequences = model.generate(
            **inputs,
            do_sample=False,
            guidance_scale=guidance_scale,
            max_new_tokens=max_new_tokens,
        )
    codes = generated_codes(sequences, prompt_len)
    if all(code.shape[1] for code in codes):
        audios = [
            audio.numpy().astype(np.float32).reshape(-1)
            for audio in processor.batch_decode(sequences, audio_prompt_len=prompt_len)
        ]
    else:
        audios = [decode_codes(processor.audio_tokenizer, code) for code in codes]
    return list(zip(codes, audios, strict=True))


def decode_codes(codec: DacModel, codes: torch.Tensor) -> np.ndarray:
    """The waveform (float32, 44.1 kHz) ``codec`` decodes from ``codes`` ``[9, frames]``, as
    ``DiaProcessor.batch_decode`` decodes one stream; no samples for no frames (where
    ``batch_decode`` raises)."""
    if codes.shape[1] == 0:
        return np.zeros(0, dtype=np.float32)
    with torch.no_grad():
        audio = codec.decode(audio_codes=codes[None]).audio_values
    return audio.squeeze().numpy().astype(np.float32).reshape(-1)


def reference_text_ids(texts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """The encoder's ``input_ids`` and ``attention_mask`` the processor makes for ``texts``:
    UTF-8 bytes, ``[S1]`` = 1 and ``[S2]`` = 2, right-padded with 0."""
    tokenizer = DiaTokenizer()
    batch = tokenizer(
        texts, padding=True, padding_side="right", add_special_tokens=False, return_tensors="pt"
    )
    return batch["input_ids"], batch["attention_mask"]


def frames_for(samples: int) -> int:
    """Codec frames of a clip of ``samples`` samples, as the processor encodes it (rounded up to
    whole hops)."""
    return math.ceil(samples / HOP_LENGTH)
