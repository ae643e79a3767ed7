"""The base class every model family implements for the engine."""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch
from torch import nn

from cadenza.contract.sampling import SamplingParams
from cadenza.engine.kv.paged_kv_cache import KVSpec, PagedKVCache
from cadenza.engine.layouts.token_layout import TokenLayout
from cadenza.kernels.attention_context import AttentionContext


class AudioTokenModel(nn.Module, ABC):
    """A decoder over token rows (``layout.num_codebooks`` ids per position), paged KV.

    ``forward(input_ids [N, K], positions [N], context, kv_cache, logits_indices [S])`` runs a
    step's flattened batch, stores its KV, and returns ``logits [S, K, V]`` for the tokens at
    ``logits_indices`` only.
    """

    layout: TokenLayout
    kv_spec: KVSpec
    vocab_size: int
    voices: tuple[str, ...] = ("default",)
    codec_name: str | None = None
    eos_ids: frozenset[int] = frozenset()
    family: str = "custom"
    default_sampling: SamplingParams = SamplingParams()

    @abstractmethod
    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        context: AttentionContext,
        kv_cache: PagedKVCache,
        logits_indices: torch.Tensor,
    ) -> torch.Tensor: ...

    def build_prompt(
        self, text: str, voice: str, prompt_codes: list[list[int]] | None = None
    ) -> list[list[int]]:
        """Token rows that ask the model to speak ``text`` in ``voice``, after a speech prompt
        given as codec frames (``[frames][codebooks]``), if any."""
        raise TypeError(f"{type(self).__name__} does not synthesize speech from text")

    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return next(self.parameters()).dtype
