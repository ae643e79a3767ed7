"""Tiny random Kyutai Pocket TTS checkpoints in the ``transformers`` file layout
(``eustlb/pocket-tts``, ``PocketTTSForConditionalGeneration``), a tiny random audio tokenizer
beside them, and ``transformers``' deterministic generate (``do_sample=False``: zero flow noise)
as the reference.

A checkpoint directory holds:

* ``config.json``: ``model_type`` ``"pocket_tts"`` with its ``flow_head_config``; the real ids
  (voice placeholder 4000, latent placeholder 4001, voice BOS 4002, audio BOS 4003, pad 3,
  vocabulary 4004), frame rate 12.5 Hz; widths, depths and ``latent_dim`` (:data:`LATENT_DIM`,
  the hub's: 32) are tiny.
* ``generation_config.json``: :data:`PUBLISHED_GENERATION` (sampling at temperature 0.7, one
  flow step, end of speech above a logit of -4 from frame 6 on, a dict out of ``generate``).
* ``model.safetensors``: the tensor names ``transformers`` saves today (``model.*``,
  ``flow_head.*``, ``eos_head.*``, ``latent_mean``, ``latent_std``), without the training-only
  ``loss_weighting.*`` and ``latent_stats_num_updates``, as the released file lacks them.
  ``latent_mean``, ``latent_std`` and ``model.bos_latent`` are drawn at random, so that the
  (de)normalisation of the latents is exercised.
* ``tokenizer.json`` and ``tokenizer_config.json`` (``TokenizersBackend``): a SentencePiece-style
  unigram model of 4000 pieces (``<unk>`` 0, ``<s>`` 1, ``</s>`` 2, ``<pad>`` 3, the 256 byte
  pieces, single characters with and without ``▁``, a few whole words, then unused pieces),
  ``Metaspace`` with a ``▁`` prepended to every text, byte fallback (any text tokenizes), and
  the four audio tokens at 4000-4003, named in ``tokenizer_config.json`` as
  ``audio_prompt_token``, ``audio_latent_token``, ``audio_prompt_bos_token`` and
  ``audio_bos_token``.
* ``processor_config.json``: the ``PocketTTSProcessor`` settings (frames after the end of
  speech: 4 for texts of at most 4 words, 2 otherwise; 5 ms fade-in), the feature extractor's
  settings (24 kHz, 1920 samples a frame, voices ended on a 80 ms pause) and the audio tokenizer
  named by ``audio_tokenizer_class`` / ``audio_tokenizer_name_or_path``.
* ``chat_template.jinja``: :data:`CHAT_TEMPLATE`.
* ``voices/<name>.safetensors``: preset voices (:data:`VOICE_FRAMES`), each one
  ``audio_prompt_latents`` tensor ``[frames, latent_dim]`` in the audio tokenizer's latent space,
  what the processor takes as ``audio_prompt_latents``.

The audio tokenizer (``PocketTTSAudioTokenizerModel``, :func:`tiny_audio_tokenizer_config`) has
the real rates (24 kHz; SEANet ratios 6, 5, 4 and a latent stride of 16: 1920 samples a frame)
with a few channels, so it decodes in milliseconds.
"""

from __future__ import annotations

import json
import math
import shutil
import string
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from safetensors.torch import load_file, save_file
from transformers import (
    PocketTTSAudioTokenizerConfig,
    PocketTTSAudioTokenizerModel,
    PocketTTSConfig,
    PocketTTSFeatureExtractor,
    PocketTTSForConditionalGeneration,
    PocketTTSProcessor,
    TokenizersBackend,
)

from cadenza.bench.pocket_throughput import AUDIO_TOKENS, CHAT_TEMPLATE, unigram_tokenizer
from tests.support.dia_checkpoints import hub_cache_snapshot

HUB_ID = "eustlb/pocket-tts"
AUDIO_TOKENIZER_HUB_ID = "eustlb/pocket-tts-audio-tokenizer"

SAMPLING_RATE = 24_000
FRAME_SIZE = 1920  # 6 * 5 * 4 SEANet samples a step, 16 steps a latent frame
FRAME_RATE = SAMPLING_RATE / FRAME_SIZE  # 12.5 frames a second
LATENT_DIM = 8  # the hub's: 32

TEXT_VOCAB = 4000
PAD_ID = 3
AUDIO_PROMPT_ID = 4000
AUDIO_LATENT_ID = 4001
AUDIO_PROMPT_BOS_ID = 4002
AUDIO_BOS_ID = 4003
VOCAB_SIZE = 4004
# AUDIO_TOKENS and CHAT_TEMPLATE come from the benchmark's checkpoint writer: the tokenizer's
# named audio tokens in id order from AUDIO_PROMPT_ID, and the processor's chat template.

PUBLISHED_GENERATION: dict[str, Any] = {
    "do_sample": True,
    "temperature": 0.7,
    "num_flow_steps": 1,
    "eos_threshold": -4.0,
    "min_frames_before_eos": 6,
    "return_dict_in_generate": True,
}
"""``generation_config.json``: the original runtime's defaults (temperature 0.7, one LSD step,
end-of-speech threshold -4) and ``generate``'s dict output."""

VOICE_FRAMES: dict[str, int] = {"alba": 6, "marius": 9}
"""The preset voices :func:`write_pocket_tts_checkpoint` writes, and their lengths in frames."""

WEIGHT_STD = 1.0
"""Spread of the drawn weights, in units of ``1 / sqrt(fan_in)``: each layer keeps the scale of
its input, so that the flow head's latents and the end-of-speech logit depend on the text."""

LATENT_OFFSET = 3.0
"""Magnitude of each entry of the flow head's output bias (signs drawn at random): the
normalised latents sit around that offset and vary by a few tenths from frame to frame. The
backbone layer-norms each latent's projection, so it sees the latent's direction, which the
offset steadies: a rounding difference in one frame shrinks over the next frames instead of
growing (without the offset, float32 rounding differences, such as eager against SDPA
attention, grow to whole units within 50 frames)."""

EOS_WEIGHT_STD = 2.0
EOS_BIAS = 5.0
"""The end-of-speech head: weights drawn with std :data:`EOS_WEIGHT_STD` and this bias. The
hidden states share the direction the latent offset gives them, which puts the logit near the
threshold (-4) and lets it wander by a few tenths from frame to frame: with seed 0, some texts
cross the threshold at the first frame allowed (6), some later (up to frame 20), and some never
within their frame budget (:data:`SEED0_ENDINGS`). For those texts the logit stays more than 0.025
away from the threshold up to the frame that decides, far above float32 rounding."""

SEED0_ENDINGS: dict[tuple[str, str | None], tuple[str, int]] = {
    ("Hello world.", None): ("eos", 11),
    ("Hello world.", "alba"): ("eos", 19),
    ("Hi.", None): ("eos", 11),
    ("Hi.", "alba"): ("eos", 12),
    ("A b c.", None): ("eos", 20),
    ("A b c.", "alba"): ("eos", 25),
    ("This is a test of the speech model.", None): ("length", 80),
    ("This is a test of the speech model.", "alba"): ("length", 80),
    ("Good morning, how are you today?", None): ("length", 134),
    ("Good morning, how are you today?", "alba"): ("length", 134),
    ("One two three four five six.", None): ("length", 121),
    ("One two three four five six.", "alba"): ("length", 121),
    ("The quick brown fox jumps over the lazy dog.", None): ("eos", 11),
    ("The quick brown fox jumps over the lazy dog.", "alba"): ("eos", 13),
}
"""How :func:`reference_pocket_tts_run` ends for a few texts (without a voice, or with the
preset ``alba``) on the checkpoint written with the defaults and seed 0: ``(ended_by,
frames)``."""

_CHARACTERS = string.ascii_letters + string.digits + ".,;:!?'\"-()"
_WORDS = ("hello", "world", "the", "and", "is", "this", "a", "test", "of", "to", "speech")


def tiny_pocket_tts_config(**overrides: Any) -> PocketTTSConfig:
    """Pocket TTS with a 2-layer backbone of width 64 (4 heads), a 2-block flow head of width
    32 and latents of :data:`LATENT_DIM`; the real ids, pad id and frame rate. ``overrides``:
    fields of :class:`PocketTTSConfig` set otherwise (``flow_head_config`` entries are merged
    into the tiny flow head's)."""
    flow_head: dict[str, Any] = {
        "hidden_size": 32,
        "num_hidden_layers": 2,
        "latent_dim": LATENT_DIM,
        "condition_dim": 64,
        "frequency_embedding_size": 16,
    }
    flow_head |= overrides.pop("flow_head_config", None) or {}
    fields: dict[str, Any] = {
        "vocab_size": VOCAB_SIZE,
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "intermediate_size": 128,
        "latent_dim": LATENT_DIM,
        "max_position_embeddings": 1024,
        "pad_token_id": PAD_ID,
        "audio_prompt_token_id": AUDIO_PROMPT_ID,
        "audio_latent_token_id": AUDIO_LATENT_ID,
        "audio_prompt_bos_token_id": AUDIO_PROMPT_BOS_ID,
        "audio_bos_token_id": AUDIO_BOS_ID,
        "frame_rate": FRAME_RATE,
    }
    fields |= overrides
    flow_head["condition_dim"] = fields["hidden_size"]
    flow_head["latent_dim"] = fields["latent_dim"]
    config = PocketTTSConfig(flow_head_config=flow_head, **fields)
    config.architectures = ["PocketTTSForConditionalGeneration"]
    return config


def tiny_audio_tokenizer_config(latent_dim: int = LATENT_DIM) -> PocketTTSAudioTokenizerConfig:
    """The audio tokenizer with the real rates (24 kHz, SEANet ratios 6, 5, 4, latent stride 16:
    :data:`FRAME_SIZE` samples a frame) and a few channels: SEANet width 16 from 4 filters, one
    transformer layer of 2 heads on each side, a depthwise upsampling (groups = width, as the
    hub's 512 = 512)."""
    config = PocketTTSAudioTokenizerConfig(
        hidden_size=16,
        num_filters=4,
        num_hidden_layers=1,
        intermediate_size=32,
        num_attention_heads=2,
        num_key_value_heads=2,
        upsample_groups=16,
        latent_dim=latent_dim,
    )
    config.architectures = ["PocketTTSAudioTokenizerModel"]
    return config


def tiny_vocab() -> list[tuple[str, float]]:
    """The tokenizer's 4000 unigram pieces and scores, in id order: ``<unk>``, ``<s>``,
    ``</s>``, ``<pad>``, the 256 ``<0xNN>`` byte pieces, ``▁``, whole words after ``▁`` (scored
    above the characters that spell them), each character after ``▁`` and alone, then
    ``<unused_N>`` pieces up to :data:`TEXT_VOCAB`."""
    vocab: list[tuple[str, float]] = [(piece, 0.0) for piece in ("<unk>", "<s>", "</s>", "<pad>")]
    vocab += [(f"<0x{byte:02X}>", 0.0) for byte in range(256)]
    vocab += [("▁", -3.0)]
    vocab += [("▁" + word, -4.0) for word in _WORDS]
    vocab += [("▁" + word.capitalize(), -4.0) for word in _WORDS if len(word) > 1]
    vocab += [("▁" + char, -5.0) for char in _CHARACTERS]
    vocab += [(char, -5.0) for char in _CHARACTERS]
    vocab += [(f"<unused_{index}>", -100.0) for index in range(TEXT_VOCAB - len(vocab))]
    return vocab


def tiny_tokenizer() -> TokenizersBackend:
    """The checkpoint's tokenizer (see the module's docstring): text -> pieces, no BOS or EOS
    added, the audio tokens 4000-4003 split out as special tokens."""
    tokenizer = unigram_tokenizer(tiny_vocab())
    ids = tokenizer.convert_tokens_to_ids(list(AUDIO_TOKENS.values()))
    assert ids == [AUDIO_PROMPT_ID, AUDIO_LATENT_ID, AUDIO_PROMPT_BOS_ID, AUDIO_BOS_ID], ids
    return tokenizer


def _draw_linear_weights(module: torch.nn.Module, generator: torch.Generator) -> None:
    for parameter_name, parameter in module.named_parameters():
        if parameter_name.endswith("weight") and parameter.dim() == 2:
            std = WEIGHT_STD / math.sqrt(parameter.shape[1])
            parameter.copy_(torch.randn(parameter.shape, generator=generator) * std)


def build_tiny_pocket_tts(
    seed: int = 0, *, eos_bias: float = EOS_BIAS, **config_overrides: Any
) -> PocketTTSForConditionalGeneration:
    """The tiny model (:func:`tiny_pocket_tts_config` with ``config_overrides``) in eval mode,
    every weight drawn from ``seed`` (the global random state is left as it was): linear weights
    at :data:`WEIGHT_STD`, the flow head's output bias at :data:`LATENT_OFFSET`, token embeddings
    and ``bos_latent`` from a unit normal, ``latent_mean``
    from N(0, 0.5), ``latent_std`` uniform in [0.5, 1.5], the end-of-speech head from
    :data:`EOS_WEIGHT_STD` with bias ``eos_bias``."""
    config = tiny_pocket_tts_config(**config_overrides)
    generator = torch.Generator().manual_seed(seed + 1)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = PocketTTSForConditionalGeneration(config)
    with torch.no_grad():
        _draw_linear_weights(model.model, generator)
        _draw_linear_weights(model.flow_head, generator)
        embeddings = model.model.embed_tokens.weight
        embeddings.copy_(torch.randn(embeddings.shape, generator=generator))
        embeddings[PAD_ID] = 0.0
        signs = torch.randint(0, 2, (config.latent_dim,), generator=generator) * 2.0 - 1.0
        model.flow_head.final_layer.proj.bias.copy_(LATENT_OFFSET * signs)
        model.model.bos_latent.copy_(torch.randn(config.latent_dim, generator=generator))
        model.latent_mean.copy_(0.5 * torch.randn(config.latent_dim, generator=generator))
        model.latent_std.copy_(0.5 + torch.rand(config.latent_dim, generator=generator))
        eos = model.eos_head
        eos.weight.copy_(EOS_WEIGHT_STD * torch.randn(eos.weight.shape, generator=generator))
        eos.bias.fill_(eos_bias)
    return model.eval()


def save_tiny_audio_tokenizer(
    directory: Path, *, seed: int = 0, latent_dim: int = LATENT_DIM
) -> Path:
    """Save a tiny random :class:`PocketTTSAudioTokenizerModel`
    (:func:`tiny_audio_tokenizer_config` with ``latent_dim``) to ``directory``
    (``config.json``, ``model.safetensors``); returns ``directory``."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = PocketTTSAudioTokenizerModel(tiny_audio_tokenizer_config(latent_dim)).eval()
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory)
    return directory


def audio_tokenizer_directory(directory: Path) -> Path:
    """Where :func:`write_pocket_tts_checkpoint` saves the audio tokenizer of the checkpoint at
    ``directory`` when no hub cache is named: the sibling ``<name>-audio-tokenizer``."""
    return directory.parent / f"{directory.name}-audio-tokenizer"


def voice_latents(name: str, *, seed: int = 0, latent_dim: int = LATENT_DIM) -> torch.Tensor:
    """The preset voice ``name`` (:data:`VOICE_FRAMES`) of the checkpoint written from ``seed``:
    ``[frames, latent_dim]`` float32, unit normal."""
    index = sorted(VOICE_FRAMES).index(name)
    generator = torch.Generator().manual_seed(1000 * (seed + 1) + index)
    return torch.randn(VOICE_FRAMES[name], latent_dim, generator=generator)


def _save_processor_files(directory: Path, audio_tokenizer: str) -> None:
    processor = PocketTTSProcessor(
        feature_extractor=PocketTTSFeatureExtractor(),
        tokenizer=tiny_tokenizer(),
        chat_template=CHAT_TEMPLATE,
    )
    processor.save_pretrained(directory)
    path = directory / "processor_config.json"
    data = json.loads(path.read_text())
    data["audio_tokenizer"] = {
        "audio_tokenizer_class": "PocketTTSAudioTokenizerModel",
        "audio_tokenizer_name_or_path": audio_tokenizer,
    }
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


def write_pocket_tts_checkpoint(
    directory: Path,
    *,
    seed: int = 0,
    voices: bool = True,
    hub_cache: Path | None = None,
    eos_bias: float = EOS_BIAS,
    **config_overrides: Any,
) -> Path:
    """Write a tiny random Pocket TTS checkpoint (:func:`build_tiny_pocket_tts` from ``seed``
    with ``eos_bias`` and ``config_overrides``) in the public file layout to ``directory``
    (created if need be), and its audio tokenizer; returns ``directory``.

    The audio tokenizer (:func:`save_tiny_audio_tokenizer`, seed ``seed + 7``) goes to
    :func:`audio_tokenizer_directory` and ``processor_config.json`` names that directory's
    absolute path; with ``hub_cache``, it goes into that hub cache as the snapshot of
    :data:`AUDIO_TOKENIZER_HUB_ID` (:func:`hub_cache_snapshot`) and ``processor_config.json``
    names the hub id. ``voices``: write ``voices/<name>.safetensors`` (:func:`voice_latents`)."""
    model = build_tiny_pocket_tts(seed, eos_bias=eos_bias, **config_overrides)
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory)
    weights = directory / "model.safetensors"
    tensors = {
        name: tensor
        for name, tensor in load_file(weights).items()
        if not name.startswith("loss_weighting.") and name != "latent_stats_num_updates"
    }
    save_file(tensors, weights, metadata={"format": "pt"})
    (directory / "generation_config.json").write_text(
        json.dumps({**PUBLISHED_GENERATION, "transformers_version": "5.25.0"}, indent=2) + "\n"
    )

    codec = audio_tokenizer_directory(directory)
    save_tiny_audio_tokenizer(codec, seed=seed + 7, latent_dim=model.config.latent_dim)
    if hub_cache is None:
        _save_processor_files(directory, str(codec.resolve()))
    else:
        hub_cache_snapshot(hub_cache, AUDIO_TOKENIZER_HUB_ID, codec)
        shutil.rmtree(codec)
        _save_processor_files(directory, AUDIO_TOKENIZER_HUB_ID)

    if voices:
        (directory / "voices").mkdir(exist_ok=True)
        for name in VOICE_FRAMES:
            latents = voice_latents(name, seed=seed, latent_dim=model.config.latent_dim)
            save_file(
                {"audio_prompt_latents": latents.contiguous()},
                directory / "voices" / f"{name}.safetensors",
                metadata={"format": "pt"},
            )
    return directory


def load_voice(directory: Path, name: str) -> torch.Tensor:
    """The preset voice ``name`` of the checkpoint at ``directory``: ``[frames, latent_dim]``."""
    return load_file(directory / "voices" / f"{name}.safetensors")["audio_prompt_latents"]


AttentionImplementation = Literal["eager", "sdpa"]


def load_reference(
    directory: Path,
    hub_cache: Path | None = None,
    attn_implementation: AttentionImplementation = "eager",
) -> tuple[PocketTTSProcessor, PocketTTSForConditionalGeneration]:
    """The processor (with its audio tokenizer) and the model (float32, ``attn_implementation``),
    as a user loads them, offline; an audio tokenizer named by hub id is looked up in
    ``hub_cache``."""
    extra: dict[str, Any] = {"local_files_only": True}
    if hub_cache is not None:
        extra["cache_dir"] = str(hub_cache)
    processor = PocketTTSProcessor.from_pretrained(str(directory), **extra)
    model = PocketTTSForConditionalGeneration.from_pretrained(
        str(directory),
        local_files_only=True,
        dtype=torch.float32,
        attn_implementation=attn_implementation,
    )
    return processor, model.eval()


def render_prompt(processor: PocketTTSProcessor, text: str, *, with_voice: bool = False) -> str:
    """The prompt ``processor.apply_chat_template`` renders for one user turn holding ``text``,
    after a voice when ``with_voice`` (the voice is one ``<|audio_prompt|>`` here: the processor
    expands it to the voice's frames)."""
    content: list[dict[str, Any]] = []
    if with_voice:
        content.append({"type": "audio", "path": "voice.wav"})
    content.append({"type": "text", "text": text})
    prompt = processor.apply_chat_template([{"role": "user", "content": content}], tokenize=False)
    assert isinstance(prompt, str)
    return prompt


def _processor_inputs(
    processor: PocketTTSProcessor,
    directory: Path,
    text: str,
    voice_audio: np.ndarray | None,
    voice: str | None,
) -> Any:
    if voice_audio is not None and voice is not None:
        raise ValueError("pass either voice_audio or voice, not both")
    prompt = render_prompt(processor, text, with_voice=voice_audio is not None or voice is not None)
    call: dict[str, Any] = {"text": prompt, "return_tensors": "pt"}
    if voice_audio is not None:
        call |= {"audio": [np.asarray(voice_audio, dtype=np.float32)], "sampling_rate": 24_000}
    if voice is not None:
        call["audio_prompt_latents"] = [load_voice(directory, voice)]
    return processor(**call)


def reference_prompt_ids(
    directory: Path,
    text: str,
    voice_audio: np.ndarray | None = None,
    voice: str | None = None,
    hub_cache: Path | None = None,
) -> list[int]:
    """The ``input_ids`` the processor makes for ``text``, after the voice ``voice_audio`` (mono
    24 kHz, encoded by the audio tokenizer) or the preset ``voice`` when given: one
    :data:`AUDIO_PROMPT_ID` per voice frame after :data:`AUDIO_PROMPT_BOS_ID`, the prepared
    text's pieces, :data:`AUDIO_BOS_ID` last."""
    processor, _ = load_reference(directory, hub_cache)
    inputs = _processor_inputs(processor, directory, text, voice_audio, voice)
    return [int(token) for token in inputs["input_ids"][0]]


def reference_frames_after_eos(directory: Path, text: str, hub_cache: Path | None = None) -> int:
    """The ``frames_after_eos`` the processor gives ``text``: 4 for at most 4 words, else 2."""
    processor, _ = load_reference(directory, hub_cache)
    inputs = _processor_inputs(processor, directory, text, None, None)
    return int(inputs["frames_after_eos"][0])


@dataclass(frozen=True)
class ReferenceRun:
    """One deterministic ``transformers`` generation and what it ended on.

    ``latents``: ``[frames, latent_dim]`` float32, denormalised, as ``generate`` returns them.
    ``waveform``: float32 ``[frames * 1920]``, ``PocketTTSProcessor.decode`` of ``latents``
    (fade-in included). ``eos_frame``: the frame whose end-of-speech logit first crossed the
    threshold (from frame ``min_frames_before_eos`` on), or ``None``. ``ended_by``: ``"eos"``
    when generation stopped ``frames_after_eos`` frames after ``eos_frame``, ``"length"`` when it
    ran out of its ``max_new_tokens`` budget (``ceil((text tokens / 3 + 2) * 12.5)``) first.
    ``eos_logits``: the end-of-speech logit of every generated frame. ``eos_margin``: the
    smallest distance of those logits to the threshold, from frame ``min_frames_before_eos`` up
    to ``eos_frame`` (or the last frame): how far a reimplementation's logits may drift before
    its ending can differ."""

    latents: torch.Tensor
    waveform: torch.Tensor
    prompt_ids: list[int]
    frames_after_eos: int
    max_new_tokens: int
    eos_logits: torch.Tensor
    eos_frame: int | None
    eos_margin: float
    ended_by: Literal["eos", "length"]

    @property
    def frames(self) -> int:
        return int(self.latents.shape[0])


def reference_pocket_tts_run(
    directory: Path,
    text: str,
    voice_audio: np.ndarray | None = None,
    voice: str | None = None,
    *,
    hub_cache: Path | None = None,
    attn_implementation: AttentionImplementation = "eager",
) -> ReferenceRun:
    """``transformers``' generation for ``text`` as a user runs it, with ``do_sample=False``
    (zero flow noise) and everything else from the checkpoint's generation config: the processor
    on the chat template's prompt (with ``voice_audio``, mono 24 kHz, or the preset ``voice``),
    ``model.generate(**inputs, do_sample=False)``, ``processor.decode`` of the latents."""
    processor, model = load_reference(directory, hub_cache, attn_implementation)
    inputs = _processor_inputs(processor, directory, text, voice_audio, voice)
    placeholders = {AUDIO_PROMPT_ID, AUDIO_LATENT_ID, AUDIO_PROMPT_BOS_ID, AUDIO_BOS_ID}
    prompt_ids = [int(token) for token in inputs["input_ids"][0]]
    num_text_tokens = sum(token not in placeholders for token in prompt_ids)
    max_new_tokens = math.ceil((num_text_tokens / 3 + 2) * model.config.frame_rate)
    with torch.no_grad():
        output = model.generate(**inputs, do_sample=False, output_scores=True)
    frames = int(output.audio_latents_mask[0].sum())
    latents = output.audio_latents[0, :frames].float().clone()
    waveform = processor.decode(latents)
    assert isinstance(waveform, torch.Tensor)
    eos_logits = torch.stack([score[0] for score in output.scores]).float()
    threshold = float(model.generation_config.eos_threshold)
    first_allowed = int(model.generation_config.min_frames_before_eos)
    crossing = [
        index
        for index, logit in enumerate(eos_logits.tolist())
        if index >= first_allowed and logit > threshold
    ]
    eos_frame = crossing[0] if crossing else None
    deciding = eos_logits[first_allowed : (eos_frame if eos_frame is not None else frames) + 1]
    eos_margin = float((deciding - threshold).abs().min()) if len(deciding) else math.inf
    frames_after_eos = int(inputs["frames_after_eos"][0])
    ended_by: Literal["eos", "length"] = "length"
    if eos_frame is not None and frames == eos_frame + frames_after_eos + 1:
        ended_by = "eos"
    return ReferenceRun(
        latents=latents,
        waveform=waveform.float(),
        prompt_ids=prompt_ids,
        frames_after_eos=frames_after_eos,
        max_new_tokens=max_new_tokens,
        eos_logits=eos_logits,
        eos_frame=eos_frame,
        eos_margin=eos_margin,
        ended_by=ended_by,
    )


def reference_pocket_tts(
    directory: Path,
    text: str,
    voice_audio: np.ndarray | None = None,
    voice: str | None = None,
    *,
    hub_cache: Path | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(latents [frames, latent_dim], waveform [frames * 1920])`` of
    :func:`reference_pocket_tts_run` (eager attention), both float32."""
    run = reference_pocket_tts_run(directory, text, voice_audio, voice, hub_cache=hub_cache)
    return run.latents, run.waveform


def voice_clip(seconds: float = 0.5, *, seed: int = 0) -> np.ndarray:
    """A mono 24 kHz float32 clip to clone a voice from: two tones under a slow envelope plus a
    little noise, drawn from ``seed``; loud to its end, so the feature extractor's pause is
    appended after all of it."""
    rng = np.random.default_rng(seed)
    time = np.arange(int(seconds * SAMPLING_RATE)) / SAMPLING_RATE
    low, high = rng.uniform(110.0, 220.0), rng.uniform(400.0, 900.0)
    envelope = 0.6 + 0.3 * np.sin(2 * np.pi * 3.0 * time)
    tones = np.sin(2 * np.pi * low * time) + 0.5 * np.sin(2 * np.pi * high * time)
    clip = 0.3 * envelope * tones + 0.02 * rng.standard_normal(time.shape)
    return clip.astype(np.float32)
