"""Llama family: Hugging Face ``LlamaForCausalLM`` checkpoints served by the engine.

A plain checkpoint is a text LM (layout ``plain``, used through ``Engine.generate_ids``). A
``cadenza.json`` beside ``config.json`` declares an audio layout (today ``flat``: codec frames
spelled as ``K`` consecutive tokens, Orpheus-style) and how text becomes a prompt; such a
model synthesizes speech through the same engine as ``cadenza-tiny``.
"""

from __future__ import annotations

import torch
from torch import nn

from cadenza.contract.sampling import SamplingParams
from cadenza.engine.kv.paged_kv_cache import PagedKVCache
from cadenza.engine.layouts.flat import FlatLayout
from cadenza.engine.layouts.token_layout import PlainLayout, TokenLayout
from cadenza.engine.models.llama import LlamaBackbone, LlamaBackboneConfig
from cadenza.engine.models.model import AudioTokenModel
from cadenza.engine.models.prompt_format import PromptFormat
from cadenza.engine.models.restricted_heads import RestrictedHeads
from cadenza.kernels.attention_context import AttentionContext


class LlamaForCausalLM(AudioTokenModel):
    """Token ids ``[N, 1]`` in, logits ``[S, 1, vocab]`` out. Parameter names follow Hugging
    Face (``model.layers.{i}...``, ``lm_head``) except ``embed_tokens``, which sits at the top
    level (the loader maps ``model.embed_tokens``)."""

    linears_giving_logits = ("lm_head",)

    def __init__(
        self,
        config: LlamaBackboneConfig,
        vocab_size: int,
        *,
        tie_word_embeddings: bool,
        eos_ids: frozenset[int],
        layout: TokenLayout | None = None,
        prompt: PromptFormat | None = None,
        codec_name: str | None = None,
        family: str = "llama",
        default_sampling: SamplingParams | None = None,
    ) -> None:
        super().__init__()
        self.config = config
        self.vocab_size = vocab_size
        self.kv_spec = config.kv_spec
        self.eos_ids = eos_ids
        self.layout = layout or PlainLayout()
        self.codec_name = codec_name
        self.family = family
        self.default_sampling = default_sampling or SamplingParams()
        self.prompt = prompt
        if prompt is not None:
            self.voices = prompt.voices
        self.embed_tokens = nn.Embedding(vocab_size, config.hidden_size)
        self.model = LlamaBackbone(config)
        self.lm_head = nn.Linear(config.hidden_size, vocab_size, bias=False)
        if tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        self.output_heads: RestrictedHeads | None = None

    def restrict_outputs(self) -> bool:
        """Split the head by the layout's masks when each leaves at most half the vocabulary
        (Orpheus: 4,097 of 156,940 ids per token): a step then computes only the logits its
        rows may emit (:attr:`restricted_outputs`). Call once the weights are loaded; whether
        it did."""
        masks = self.layout.sampling_masks()
        if masks is None or 2 * int(masks.sum(dim=(1, 2)).max()) > self.vocab_size:
            return False
        self.output_heads = RestrictedHeads(self.lm_head.weight, masks)
        return True

    @property
    def restricted_outputs(self) -> RestrictedHeads | None:
        return self.output_heads

    def hidden_states(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        context: AttentionContext,
        kv_cache: PagedKVCache,
        logits_indices: torch.Tensor,
    ) -> torch.Tensor:
        """The final hidden states ``[S, H]`` at ``logits_indices`` (for the restricted heads)."""
        hidden = self.model(self.embed_tokens(input_ids[:, 0]), positions, context, kv_cache)
        selected: torch.Tensor = hidden[logits_indices]
        return selected

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        context: AttentionContext,
        kv_cache: PagedKVCache,
        logits_indices: torch.Tensor,
    ) -> torch.Tensor:
        hidden = self.model(self.embed_tokens(input_ids[:, 0]), positions, context, kv_cache)
        return self.lm_head(hidden[logits_indices])[:, None, :]

    def build_prompt(
        self, text: str, voice: str, prompt_codes: list[list[int]] | None = None
    ) -> list[list[int]]:
        if self.prompt is None or not isinstance(self.layout, FlatLayout):
            return super().build_prompt(text, voice, prompt_codes)
        audio = [token for frame in prompt_codes or [] for token in self.layout.tokens_of(frame)]
        return [[token] for token in self.prompt.token_ids(text, voice, audio)]
