"""Sesame CSM (``sesame/csm-1b`` in the ``transformers`` layout): a Llama backbone that
predicts each Mimi frame's first codebook, a small depth decoder for the other 31, speaking
through the Mimi codec stored in the same checkpoint.

* Positions: a text position embeds its token (``embed_text_tokens``); an audio position is the
  sum of its 32 codes' embeddings (``embed_audio_tokens`` at ``codebook * 2051 + code``). Rows
  are 32 wide; text rows are marked (:mod:`~cadenza.engine.layouts.frame_rows`).
* One frame: the backbone's hidden state at the last position gives codebook 0 (``lm_head``);
  the depth decoder (:class:`CsmDepthDecoder`) starts from that hidden state (projected) and
  codebook 0's embedding, and each of its positions ``p`` predicts codebook ``p`` through its
  own head ``codebooks_head[p - 1]``; the next codebook's embedding is its next input.
* Prompt (what ``transformers``' processor and Sesame's generator build): for each context turn
  ``<|begin_of_text|>[speaker]text<|end_of_text|>`` then its audio frames and an all-zero
  frame; then the turn to speak, ``<|begin_of_text|>[speaker]text<|end_of_text|>``. Voices are
  speaker ids (``"0"``, ``"1"``). A speech prompt without a transcript is a context turn of
  the same speaker with empty text.
* The utterance ends with a frame whose first 31 codes are 0 (not audio).
* Sampling defaults: the checkpoint's ``generation_config.json`` where it samples, else
  temperature 0.9 and top-k 50 (Sesame's); the same settings apply to every codebook.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch import nn

from cadenza.contract.sampling import SamplingParams
from cadenza.engine.kv.paged_kv_cache import PagedKVCache
from cadenza.engine.layouts.frame_rows import FrameRowLayout, text_row
from cadenza.engine.models.depth_scratch import DepthScratch
from cadenza.engine.models.llama import LlamaBackbone, LlamaBackboneConfig
from cadenza.engine.models.model import AudioTokenModel, DepthDecoding, PromptTurn
from cadenza.engine.models.prompt_format import TextEncoder
from cadenza.kernels.attention_context import AttentionContext

BEGIN_OF_TEXT = 128000
END_OF_TEXT = 128001
SPEAKERS = ("0", "1")
SAMPLING_DEFAULTS: dict[str, float] = {"temperature": 0.9, "top_k": 50}
MIMI_CODEBOOK_SIZE = 2048


class CsmDepthDecoder(nn.Module):
    """The depth decoder (parameter names as ``transformers``' ``CsmDepthDecoderForCausalLM``
    without its ``model.`` level for the transformer: ``model.layers`` → ``transformer.layers``)."""

    linears_giving_logits = ("heads",)

    def __init__(
        self,
        config: LlamaBackboneConfig,
        num_codebooks: int,
        vocab_size: int,
        backbone_hidden_size: int,
    ) -> None:
        super().__init__()
        self.num_levels = num_codebooks - 1
        self.vocab_size = vocab_size
        self.embed_tokens = nn.Embedding(num_codebooks * vocab_size, backbone_hidden_size)
        self.inputs_embeds_projector = nn.Linear(
            backbone_hidden_size, config.hidden_size, bias=False
        )
        self.transformer = LlamaBackbone(config)
        self.codebooks_head = nn.Parameter(
            torch.empty(num_codebooks - 1, config.hidden_size, vocab_size)
        )
        self.heads: nn.ModuleList | None = None  # the same weights as linears, for serving
        # Positions 0 (the backbone's state), 1 (codebook 0) ... num_codebooks - 1.
        self.scratch = DepthScratch(config.kv_spec, num_codebooks)

    def begin(self, hidden: torch.Tensor, first_ids: torch.Tensor) -> _CsmFrame:
        return _CsmFrame(self, hidden, first_ids)

    def run(self, embeddings: torch.Tensor, rows: int, start: int) -> torch.Tensor:
        """Backbone-width ``embeddings`` for ``rows`` streams at positions ``start ..``
        (position-major) -> the transformer's hidden states."""
        count = embeddings.shape[0] // rows
        device = embeddings.device
        cache = self.scratch.cache_for(rows, embeddings.dtype, device)
        context = self.scratch.context(rows, start, count, device)
        positions = self.scratch.positions_of(rows, start, count, device)
        projected = self.inputs_embeds_projector(embeddings)
        out: torch.Tensor = self.transformer(projected, positions, context, cache)
        return out

    def head(self, hidden: torch.Tensor, codebook: int) -> torch.Tensor:
        """Logits ``[S, V]`` of ``codebook`` (1 ..) from the depth hidden states ``[S, H]``."""
        if self.heads is not None:
            logits: torch.Tensor = self.heads[codebook - 1](hidden)
            return logits
        return hidden @ self.codebooks_head[codebook - 1]

    def split_heads(self) -> None:
        """Turn the per-codebook heads into linear layers (which serving then prepacks or
        quantizes like every other linear); the stacked parameter is dropped. Call after the
        weights are loaded."""
        stacked = self.codebooks_head.detach()
        heads = []
        for weight in stacked:
            linear = nn.Linear(weight.shape[0], weight.shape[1], bias=False)
            linear.weight = nn.Parameter(weight.T.contiguous(), requires_grad=False)
            heads.append(linear)
        self.heads = nn.ModuleList(heads)
        del self.codebooks_head


class _CsmFrame:
    """One frame's depth loop (a :class:`~cadenza.engine.models.model.DepthLoop`)."""

    def __init__(self, decoder: CsmDepthDecoder, hidden: torch.Tensor, first_ids: torch.Tensor):
        self.decoder = decoder
        self.rows = hidden.shape[0]
        embeddings = torch.cat([hidden, decoder.embed_tokens(first_ids)])
        out = decoder.run(embeddings, self.rows, start=0)
        self.level = 1
        self.logits = decoder.head(out[self.rows :], self.level)

    def advance(self, ids: torch.Tensor) -> torch.Tensor:
        """``ids [S]`` of codebook :attr:`level` -> logits of the next codebook."""
        decoder = self.decoder
        embeddings = decoder.embed_tokens(ids + self.level * decoder.vocab_size)
        out = decoder.run(embeddings, self.rows, start=self.level + 1)
        self.level += 1
        self.logits = decoder.head(out, self.level)
        return self.logits


class CsmPrompt:
    """Token rows of CSM prompts (see the module docstring)."""

    def __init__(self, encode_text: TextEncoder, num_codebooks: int, voices: tuple[str, ...]):
        self.encode_text = encode_text
        self.num_codebooks = num_codebooks
        self.voices = voices

    def text_rows(self, text: str, speaker: str) -> list[list[int]]:
        ids = [BEGIN_OF_TEXT, *self.encode_text(f"[{speaker}]{text}"), END_OF_TEXT]
        return [text_row(token, self.num_codebooks) for token in ids]

    def turn_rows(self, text: str, speaker: str, frames: list[list[int]]) -> list[list[int]]:
        """A context turn: its text, its audio frames, the all-zero end frame."""
        if any(len(frame) != self.num_codebooks for frame in frames):
            raise ValueError(f"context audio frames must have {self.num_codebooks} codes")
        end = [0] * self.num_codebooks
        return [*self.text_rows(text, speaker), *(list(f) for f in frames), end]


class CsmModel(AudioTokenModel):
    """Token rows ``[N, 32]`` in; a step's first-codebook logits ``[S, 1, 2051]`` out, the
    rest of each row from :attr:`depth`. Parameter names follow ``transformers``'
    ``CsmForConditionalGeneration`` (the loader maps the embeddings and the depth decoder)."""

    linears_giving_logits = ("lm_head",)

    def __init__(
        self,
        backbone: LlamaBackboneConfig,
        depth: LlamaBackboneConfig,
        *,
        num_codebooks: int,
        vocab_size: int,
        text_vocab_size: int,
        prompt: CsmPrompt,
        codec_name: str,
        default_sampling: SamplingParams,
        codebook_size: int = MIMI_CODEBOOK_SIZE,
        eos_code: int = 0,
        max_positions: int | None = None,
    ) -> None:
        super().__init__()
        self.family = "csm"
        self.takes_context = True
        self.max_positions = max_positions
        self.config = backbone
        self.vocab_size = vocab_size
        self.text_vocab_size = text_vocab_size
        self.kv_spec = backbone.kv_spec
        self.layout = FrameRowLayout(num_codebooks, codebook_size, vocab_size, eos_code)
        self.prompt = prompt
        self.voices = prompt.voices
        self.codec_name = codec_name
        self.default_sampling = default_sampling
        self.embed_text_tokens = nn.Embedding(text_vocab_size, backbone.hidden_size)
        self.embed_audio_tokens = nn.Embedding(num_codebooks * vocab_size, backbone.hidden_size)
        self.backbone_model = LlamaBackbone(backbone)
        self.lm_head = nn.Linear(backbone.hidden_size, vocab_size, bias=False)
        self.depth_decoder = CsmDepthDecoder(depth, num_codebooks, vocab_size, backbone.hidden_size)
        self.offsets: torch.Tensor
        self.register_buffer("offsets", torch.arange(num_codebooks) * vocab_size, persistent=False)

    @property
    def depth(self) -> DepthDecoding:
        return self.depth_decoder

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Rows ``[N, K]`` -> backbone inputs ``[N, H]``: text rows their token's embedding,
        audio rows the sum of their codes' embeddings."""
        is_text = input_ids[:, 1] < 0
        text = self.embed_text_tokens(input_ids[:, 0].clamp(0, self.text_vocab_size - 1))
        audio_ids = input_ids.clamp(0, self.vocab_size - 1) + self.offsets
        audio = self.embed_audio_tokens(audio_ids).sum(dim=1)
        return torch.where(is_text[:, None], text, audio)

    def hidden_states(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        context: AttentionContext,
        kv_cache: PagedKVCache,
        logits_indices: torch.Tensor,
    ) -> torch.Tensor:
        hidden = self.backbone_model(self.embed(input_ids), positions, context, kv_cache)
        selected: torch.Tensor = hidden[logits_indices]
        return selected

    def first_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        logits: torch.Tensor = self.lm_head(hidden)[:, None, :]
        return logits

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        context: AttentionContext,
        kv_cache: PagedKVCache,
        logits_indices: torch.Tensor,
    ) -> torch.Tensor:
        return self.first_logits(
            self.hidden_states(input_ids, positions, context, kv_cache, logits_indices)
        )

    def build_prompt(
        self, text: str, voice: str, prompt_codes: list[list[int]] | None = None
    ) -> list[list[int]]:
        context = [(voice, "", prompt_codes)] if prompt_codes else []
        return self.build_prompt_with_context(text, voice, context)

    def build_prompt_with_context(
        self, text: str, voice: str, context: list[PromptTurn]
    ) -> list[list[int]]:
        rows = [row for turn in context for row in self.prompt.turn_rows(turn[1], turn[0], turn[2])]
        return [*rows, *self.prompt.text_rows(text, voice)]


def is_csm_config(config: dict[str, Any]) -> bool:
    return config.get("model_type") == "csm"


def csm_sampling_defaults(directory: Path) -> dict[str, float]:
    """Temperature and top-k from ``generation_config.json`` where it samples, else Sesame's."""
    try:
        config = json.loads((directory / "generation_config.json").read_text())
    except (OSError, ValueError):
        return dict(SAMPLING_DEFAULTS)
    if not isinstance(config, dict) or not config.get("do_sample", False):
        return dict(SAMPLING_DEFAULTS)
    keys = ("temperature", "top_k", "top_p", "min_p")
    own = {k: config[k] for k in keys if isinstance(config.get(k), (int, float))}
    return {**SAMPLING_DEFAULTS, **own}


def map_csm_key(key: str) -> str | None:
    """A ``transformers`` CSM tensor name -> this model's (``None``: not the backbone's or the
    depth decoder's, e.g. the codec's, loaded by the codec)."""
    if key.startswith("codec_model."):
        return None
    if key == "depth_decoder.codebooks_head.weight":
        return "depth_decoder.codebooks_head"
    if key == "backbone_model.embed_tokens.embed_audio_tokens.weight":
        return "embed_audio_tokens.weight"
    if key.startswith("depth_decoder.model.layers.") or key == "depth_decoder.model.norm.weight":
        return "depth_decoder.transformer." + key.removeprefix("depth_decoder.model.")
    if key.startswith("depth_decoder.model."):
        return "depth_decoder." + key.removeprefix("depth_decoder.model.")
    return key
