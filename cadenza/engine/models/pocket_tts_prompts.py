"""A Pocket TTS checkpoint's prompts, as its ``PocketTTSProcessor`` makes them: the chat
template (``chat_template.jinja``, or the processor's or tokenizer's config) rendered for one
user turn (a voice item, when there is a voice, then the text), each voice placeholder expanded
to one per voice frame, tokenized by ``tokenizer.json``; the frames made after the end of
speech by the text's word count (``processor_config.json``); the preset voices
(``voices/<name>.safetensors``, each an ``audio_prompt_latents`` tensor ``[frames,
latent_dim]``); and the audio tokenizer the processor names.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

from cadenza.engine.models.checkpoint import CheckpointError, named_audio_tokenizer, read_json
from cadenza.engine.models.pocket_tts import PocketPrompts, PocketTTSSpec

_AUDIO_TOKEN_NAMES = {
    "audio_prompt_token": "audio_prompt_id",
    "audio_latent_token": "audio_latent_id",
    "audio_prompt_bos_token": "audio_prompt_bos_id",
    "audio_bos_token": "audio_bos_id",
}
"""The tokenizer's named audio tokens and the config ids they must have."""

# transformers' ``clean_up_tokenization``: spaces before punctuation and contractions dropped.
_CLEAN_UPS = (
    (" .", "."),
    (" ?", "?"),
    (" !", "!"),
    (" ,", ","),
    (" ' ", "'"),
    (" n't", "n't"),
    (" 'm", "'m"),
    (" 's", "'s"),
    (" 've", "'ve"),
    (" 're", "'re"),
)


def audio_tokenizer_reference(directory: Path) -> str:
    """The audio tokenizer the processor names (a directory or a hub id)."""
    name = named_audio_tokenizer(directory)
    if name is None:
        raise CheckpointError(
            f"{directory}: no audio tokenizer named (audio_tokenizer_config.json, or "
            "processor_config.json's audio_tokenizer)"
        )
    return name


def load_prompts(directory: Path, spec: PocketTTSSpec) -> PocketPrompts:
    """The checkpoint's prompt maker; :class:`CheckpointError` when its files are missing or
    disagree with the config (audio tokens at other ids)."""
    from tokenizers import Tokenizer

    path = directory / "tokenizer.json"
    if not path.exists():
        raise CheckpointError(f"{directory}: no tokenizer.json")
    tokenizer = Tokenizer.from_file(str(path))
    settings = _json_if_exists(directory / "tokenizer_config.json")
    processor = _json_if_exists(directory / "processor_config.json")
    tokens: dict[str, str] = {}
    for name, field in _AUDIO_TOKEN_NAMES.items():
        token = settings.get(name)
        if not isinstance(token, str) or tokenizer.token_to_id(token) != getattr(spec, field):
            raise CheckpointError(
                f"{directory}: the tokenizer's {name} must be the token of id "
                f"{getattr(spec, field)} (config.json)"
            )
        tokens[name] = token
    template = _compile(_chat_template(directory, settings, processor))
    clean_up = bool(settings.get("clean_up_tokenization_spaces", False))
    short_words = int(processor.get("short_text_max_words", 4))
    short_tail = int(processor.get("frames_after_eos_short_text", 4))
    tail = int(processor.get("frames_after_eos", 2))
    voice_token = tokens["audio_prompt_token"]

    def render(text: str, voice_frames: int) -> list[int]:
        content: list[dict[str, Any]] = [{"type": "audio"}] if voice_frames else []
        if text.strip():  # no text: the prompt's overhead alone (requests always have text)
            content.append({"type": "text", "text": text})
        prompt = template([{"role": "user", "content": content}])
        if voice_frames:
            prompt = prompt.replace(voice_token, voice_token * voice_frames)
        return list(tokenizer.encode(prompt, add_special_tokens=True).ids)

    def frames_after_eos(ids: list[int]) -> int:
        said = tokenizer.decode(ids, skip_special_tokens=True)
        if clean_up:
            for before, after in _CLEAN_UPS:
                said = said.replace(before, after)
        return short_tail if len(said.split()) <= short_words else tail

    return PocketPrompts(render=render, frames_after_eos=frames_after_eos)


def load_voice_presets(directory: Path, latent_dim: int) -> dict[str, torch.Tensor]:
    """The checkpoint's preset voices by name (``voices/<name>.safetensors``), float32
    ``[frames, latent_dim]``; none without a ``voices/`` directory."""
    folder = directory / "voices"
    presets: dict[str, torch.Tensor] = {}
    if not folder.is_dir():
        return presets
    for path in sorted(folder.glob("*.safetensors")):
        try:
            latents = load_file(str(path))["audio_prompt_latents"]
        except (KeyError, OSError, ValueError) as exc:
            raise CheckpointError(f"{path}: not a voice (audio_prompt_latents): {exc}") from exc
        if latents.dim() != 2 or latents.shape[1] != latent_dim or latents.shape[0] < 1:
            raise CheckpointError(
                f"{path}: a voice is [frames, {latent_dim}] latents, got {tuple(latents.shape)}"
            )
        if path.stem == "default":
            raise CheckpointError(f"{path}: 'default' is the voice without a prompt")
        presets[path.stem] = latents.to(torch.float32)
    return presets


def _json_if_exists(path: Path) -> dict[str, Any]:
    return read_json(path) if path.exists() else {}


def _chat_template(directory: Path, settings: dict[str, Any], processor: dict[str, Any]) -> str:
    path = directory / "chat_template.jinja"
    if path.exists():
        return path.read_text()
    for source in (processor, settings):
        template = source.get("chat_template")
        if isinstance(template, str):
            return template
    raise CheckpointError(f"{directory}: no chat template (chat_template.jinja)")


def _compile(source: str) -> Callable[[list[dict[str, Any]]], str]:
    """The template as ``transformers`` renders chat templates: a sandboxed Jinja environment
    trimming blocks, with loop controls."""
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    environment = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols]
    )
    try:
        template = environment.from_string(source)
    except Exception as exc:  # jinja2's TemplateSyntaxError and friends
        raise CheckpointError(f"the chat template does not compile: {exc}") from exc

    def render(messages: list[dict[str, Any]]) -> str:
        return template.render(messages=messages, add_generation_prompt=False)

    return render
