"""``cadenza.json``: how a Llama checkpoint's tokens spell codec frames (the ``flat`` layout:
``K`` consecutive tokens per frame, Orpheus-style) and how text becomes its prompt. A family
that recognises its checkpoints from their own files (Orpheus) supplies the same declaration
itself; a ``cadenza.json`` beside it overrides fields."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from cadenza.contract.sampling import SamplingParams
from cadenza.engine.layouts.flat import FlatLayout
from cadenza.engine.models.checkpoint import CheckpointError, read_json, text_encoder
from cadenza.engine.models.prompt_format import PromptFormat, TemplatePrompt, TokenPrompt

DECLARATION = "cadenza.json"


class SamplingDefaults(BaseModel):
    """A model's own sampling defaults (each unset one keeps the library's)."""

    model_config = ConfigDict(extra="forbid")

    temperature: float | None = Field(None, ge=0)
    top_k: int | None = Field(None, ge=0)
    top_p: float | None = Field(None, gt=0, le=1)
    min_p: float | None = Field(None, ge=0, lt=1)
    repetition_penalty: float | None = Field(None, gt=0)

    def params(self) -> SamplingParams:
        return SamplingParams(**self.model_dump(exclude_none=True))


class AudioLayoutConfig(BaseModel):
    """The declaration, validated.

    ``prompt_template`` (say ``"{voice}: {text}"``) writes voice and text into one string
    tokenized together; ``voices`` is then a list of names. Without it each voice is a list of
    token ids placed before the text."""

    model_config = ConfigDict(extra="forbid")

    family: str = "custom"
    layout: Literal["flat"]
    codec: str = "encodec_24khz"
    num_codebooks: int = Field(ge=1)
    codebook_size: int = Field(ge=2)
    audio_token_offset: int = Field(ge=0)
    audio_eos_id: int = Field(ge=0)
    frame_order: list[int] | None = None
    text_tokenizer: Literal["bytes", "tokenizer.json"] = "bytes"
    add_special_tokens: bool = False
    prompt_template: str | None = None
    prompt_prefix_ids: list[int] = []
    prompt_suffix_ids: list[int] = []
    voices: dict[str, list[int]] | list[str] = {"default": []}
    sampling: SamplingDefaults = SamplingDefaults()


def declared(directory: Path) -> dict[str, Any] | None:
    """The checkpoint's ``cadenza.json`` as written (``None`` without one)."""
    path = directory / DECLARATION
    return read_json(path) if path.exists() else None


def validated(directory: Path, declaration: dict[str, Any]) -> AudioLayoutConfig:
    """``declaration`` checked field by field; :class:`CheckpointError` names the first bad one."""
    try:
        return AudioLayoutConfig.model_validate(declaration)
    except ValidationError as exc:
        first = exc.errors()[0]
        raise CheckpointError(
            f"{directory / DECLARATION}: {first['msg']} at {first['loc']}"
        ) from exc


def flat_audio(directory: Path, layout: AudioLayoutConfig, vocab_size: int) -> dict[str, Any]:
    """What a Llama model speaking ``layout`` is built with: its token layout, prompt format,
    codec, family name and sampling defaults (keyword arguments of ``LlamaForCausalLM``)."""
    try:
        flat = FlatLayout(
            layout.num_codebooks,
            layout.codebook_size,
            layout.audio_token_offset,
            layout.audio_eos_id,
            vocab_size,
            frame_order=layout.frame_order,
        )
        encode_text = text_encoder(directory, layout.text_tokenizer, layout.add_special_tokens)
        prompt: PromptFormat
        if layout.prompt_template is not None:
            prompt = TemplatePrompt(
                encode_text,
                layout.prompt_template,
                tuple(layout.voices),
                layout.prompt_prefix_ids,
                layout.prompt_suffix_ids,
            )
        elif isinstance(layout.voices, dict):
            prompt = TokenPrompt(
                encode_text, layout.voices, layout.prompt_prefix_ids, layout.prompt_suffix_ids
            )
        else:
            raise ValueError("voices without ids need a prompt_template")
        sampling = layout.sampling.params()
    except (ValueError, OSError) as exc:
        raise CheckpointError(f"{directory}: {exc}") from exc
    return {
        "layout": flat,
        "prompt": prompt,
        "codec_name": layout.codec,
        "family": layout.family,
        "default_sampling": sampling,
    }
