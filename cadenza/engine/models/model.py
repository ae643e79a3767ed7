"""The base class every model family implements for the engine, and the capabilities the
engine asks of it (never the family itself): a two-level model's depth decoder, backbones the
fused native CPU step can run, output heads restricted to the ids a row position may emit,
per-stream state (an encoder's output and cross-attention keys, computed once per stream),
a hook between the forward pass and sampling (classifier-free guidance mixing a stream's
conditional and unconditional logits), a sampler of the model's own (a flow head drawing
continuous latents, where there is no vocabulary), prefix-cache keys of the model's choosing,
and the model-specific sampling fields it takes.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Protocol, runtime_checkable

import torch
from torch import nn

from cadenza.contract.sampling import SamplingParams
from cadenza.engine.kv.paged_kv_cache import KVSpec, PagedKVCache
from cadenza.engine.layouts.token_layout import TokenLayout
from cadenza.engine.models.restricted_heads import RestrictedHeads
from cadenza.engine.models.stream_state import StreamConditioning, StreamState
from cadenza.engine.sequence import Sequence
from cadenza.kernels.attention_context import AttentionContext


class DepthLoop(Protocol):
    """One frame's depth decoding for a batch of ``S`` streams, all at the same level.

    :attr:`logits` ``[S, V]`` are those of the next level to sample; :meth:`advance` takes the
    ids sampled from them and returns the logits of the level after (the loop never asks past
    the last level)."""

    logits: torch.Tensor

    def advance(self, ids: torch.Tensor) -> torch.Tensor: ...


class DepthDecoding(Protocol):
    """The second level of a two-level model (Sesame CSM, the Moshi family): after the backbone
    step that samples a frame's first codebook, a small decoder emits the other
    ``num_levels`` codebooks one after another, each sampled before the next is computed. Its
    state lives only within one frame."""

    num_levels: int

    def begin(self, hidden: torch.Tensor, first_ids: torch.Tensor) -> DepthLoop:
        """Start the frame of each stream from the backbone's hidden state ``[S, H]`` at its
        last position and the first codebook's sampled ids ``[S]``."""
        ...


class FusedDecodeStep(Protocol):
    """A backbone's decode step in one native call (what the runner and builder ask of it)."""

    weight_dtype: torch.dtype

    def supports_cache(self, kv_cache: PagedKVCache) -> bool:
        """Whether the step reads ``kv_cache``'s pages in place (its dtype and device)."""
        ...


@runtime_checkable
class ServingBackbone(Protocol):
    """A backbone that rearranges its weights for serving: projections fused into larger
    products, and on the CPU the fused native decode step where the kernel runs its shape."""

    fused_decode: FusedDecodeStep | None

    def fuse_projections(self) -> int:
        """Fuse q/k/v and gate/up in every layer; returns how many modules were fused."""
        ...

    def enable_fused_cpu_decode(self, weight_dtype: torch.dtype) -> bool:
        """Give the backbone the fused CPU step multiplying in ``weight_dtype``, where the
        kernel can run it and builds here; whether it got it."""
        ...


PromptTurn = tuple[str, str, list[list[int]]]
"""A conversation turn as a prompt takes it: voice, text, codec frames."""


class AudioTokenModel(nn.Module, ABC):
    """A decoder over token rows (``layout.num_codebooks`` ids per position), paged KV.

    ``forward(input_ids [N, K], positions [N], context, kv_cache, logits_indices [S])`` runs a
    step's flattened batch, stores its KV, and returns ``logits [S, K, V]`` for the tokens at
    ``logits_indices`` only.

    A stateful model (:attr:`keeps_stream_state`) gets a keyword ``streams``
    (:class:`StepStreams`) as well: each stream's :class:`StreamState`, from
    :meth:`begin_stream`. Its logits then pass through :meth:`process_logits` before they are
    sampled (a guided model mixes its two branches there). Its rows need not carry the text:
    :meth:`prefix_conditioning` says what else must match for two streams to share KV.

    A model that samples its own rows (:attr:`samples_rows`: continuous latents drawn by a
    flow head) returns from ``forward`` whatever its sampler needs at each sampling token
    (``[S, 1, F]``, checked for NaN like logits) and :meth:`sample_rows` turns it into rows;
    the engine's sampler is not used.

    A two-level model sets :attr:`depth`: its rows are ``K`` wide but one step samples only
    the first id from the backbone (``forward`` returns ``logits [S, 1, V]``); the runner then
    gets the hidden states (:meth:`hidden_states`, :meth:`first_logits`) and runs the depth
    decoder for the rest of the row.
    """

    layout: TokenLayout
    kv_spec: KVSpec
    vocab_size: int
    voices: tuple[str, ...] = ("default",)
    codec_name: str | None = None
    eos_ids: frozenset[int] = frozenset()
    family: str = "custom"
    default_sampling: SamplingParams = SamplingParams()
    takes_context: bool = False  # builds prompts from earlier conversation turns
    sampling_fields: frozenset[str] = frozenset()  # model-specific SamplingParams it takes
    keeps_stream_state: bool = False  # forward takes ``streams`` (StepStreams)
    samples_rows: bool = False  # draws its rows itself (sample_rows), not the engine's sampler
    # A model whose text does not set the length (a music model's description): a stream
    # lasts the request's max_duration_s, else this (None: the length follows the text).
    default_duration_s: float | None = None
    # Speaks a text longer than one sentence as consecutive one-sentence segments (the edge
    # cuts it: first audio after the first sentence).
    segments_text: bool = False
    max_positions: int | None = None  # positions the model was trained for (None: no limit)

    @abstractmethod
    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        context: AttentionContext,
        kv_cache: PagedKVCache,
        logits_indices: torch.Tensor,
    ) -> torch.Tensor: ...

    @property
    def depth(self) -> DepthDecoding | None:
        """The depth decoder of a two-level model (``None``: one level)."""
        return None

    def serving_backbones(self) -> list[ServingBackbone]:
        """The model's backbones, its main (paged) one first."""
        return [m for m in self.modules() if m is not self and isinstance(m, ServingBackbone)]

    @property
    def fused_decode(self) -> FusedDecodeStep | None:
        """The fused CPU decode step of the main backbone, if it has one."""
        backbones = self.serving_backbones()
        return backbones[0].fused_decode if backbones else None

    @property
    def restricted_outputs(self) -> RestrictedHeads | None:
        """Heads that compute only the logits a row position may emit (``None``: every id)."""
        return None

    def hidden_states(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        context: AttentionContext,
        kv_cache: PagedKVCache,
        logits_indices: torch.Tensor,
    ) -> torch.Tensor:
        """The final hidden states ``[S, H]`` at ``logits_indices``: what a two-level model's
        depth decoder and restricted heads (:attr:`restricted_outputs`) start from."""
        raise TypeError(f"{type(self).__name__} gives no hidden states")

    def first_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """A two-level model's first-codebook logits ``[S, 1, V]`` from :meth:`hidden_states`."""
        raise TypeError(f"{type(self).__name__} is not a two-level model")

    def build_prompt(
        self, text: str, voice: str, prompt_codes: list[list[int]] | None = None
    ) -> list[list[int]]:
        """Token rows that ask the model to speak ``text`` in ``voice``, after a speech prompt
        given as codec frames (``[frames][codebooks]``), if any."""
        raise TypeError(f"{type(self).__name__} does not synthesize speech from text")

    def build_prompt_with_context(
        self, text: str, voice: str, context: list[PromptTurn]
    ) -> list[list[int]]:
        """Token rows that ask the model to speak ``text`` in ``voice`` after the conversation
        ``context`` (oldest turn first); only models with :attr:`takes_context`."""
        raise TypeError(f"{type(self).__name__} takes no conversation context")

    @property
    def state_bytes_per_stream(self) -> int:
        """The most memory one stream's :class:`StreamState` holds (0: no per-stream state)."""
        return 0

    def check_request(self, text: str, sampling: SamplingParams) -> None:
        """Raise ``ValueError`` for a text or settings this model cannot take (the request is
        then refused with the reason, before anything runs); the default takes any."""

    def begin_stream(self, conditioning: StreamConditioning) -> StreamState:
        """A stateful model's state for a new stream (its encoder run once); ``ValueError``
        for a request it cannot condition on."""
        raise TypeError(f"{type(self).__name__} keeps no per-stream state")

    def process_logits(self, logits: torch.Tensor, states: list[StreamState]) -> torch.Tensor:
        """A stateful model's last word on the logits ``[S, K, V]`` of the streams sampling
        this step (``states``, in the same order) before the sampler draws from them: guidance,
        the model's own filters. The default keeps them as they are."""
        return logits

    def sample_rows(self, outputs: torch.Tensor, seqs: list[Sequence]) -> list[list[int]]:
        """A model with :attr:`samples_rows`: the next row of each of ``seqs`` from
        ``outputs [S, 1, F]`` (what ``forward`` returned at their last tokens, in the same
        order). Each stream draws from its own ``generator``, so its rows do not depend on
        the batch; ``temperature`` 0 draws nothing. It changes no sequence."""
        raise TypeError(f"{type(self).__name__} has no sampler of its own")

    def replay_row(self, seq: Sequence, row: list[int]) -> None:
        """A model with :attr:`samples_rows`, resuming ``seq`` from rows another engine made:
        ``ValueError`` unless ``row`` could be its next row, else advance its generator past
        the draws :meth:`sample_rows` made for it (the stream then draws on as it would
        have). It does not append the row."""
        raise TypeError(f"{type(self).__name__} has no sampler of its own")

    def prefix_conditioning(self, conditioning: StreamConditioning) -> str:
        """What, besides its token rows, a stream's KV depends on (a prefix-cache key): the
        voice for a model whose rows carry the text; a model that conditions on the text some
        other way (an encoder) adds the text, and what else shapes its KV (guidance)."""
        return f"voice={conditioning.voice}"

    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return next(self.parameters()).dtype
