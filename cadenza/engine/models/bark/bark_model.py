"""Bark on the paged engine: the semantic and the coarse stage share the engine's paged KV and
its steps; the fine stage runs on each stream's coarse codes as they complete.

A Bark stream is one engine sequence that runs through several contexts
(:class:`~cadenza.engine.layouts.token_layout.ContextRestarts`, laid out by
:class:`~cadenza.engine.models.bark.bark_layout.BarkLayout`): first the semantic stage (its
prompt is the text, the voice's semantic history summed into the same positions, then the
infer token; its tokens follow), then each coarse window, a fresh prompt from position 0 (the
semantic tokens around it, the infer token, the last coarse tokens) and its tokens. Every
context is prefilled in chunks and decoded by the same scheduler, batched with every other
stream, whatever its stage.

Rows are two ids wide: the id in its stage's own vocabulary, then the stage (``SEMANTIC`` or
``COARSE``, which the layout forces), so a row says which stage reads it and the prefix
cache never mixes the two. A step runs each layer's projections per stage (only for the tokens
of that stage) and the attention once for all tokens: both stages have the same shape and
write the same paged KV (a stream is in one stage at a time). Its logits are the stage's own
(the other stage's ids beyond its vocabulary -inf) for the first id, and nothing to choose
for the second.

The voice's semantic history is a stream state (:class:`BarkStreamState`, with the stream's
progress through the stages, which the layout keeps), added to the semantic prompt's first
``max_input_semantic_length`` positions; the prefix cache keys on the voice, as for any model.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from cadenza.contract.sampling import SamplingParams
from cadenza.engine.kv.paged_kv_cache import KVSpec, PagedKVCache
from cadenza.engine.models.bark.bark_checkpoint import BarkCheckpoint
from cadenza.engine.models.bark.bark_gpt import BarkCausalGPT, BarkFineGPT
from cadenza.engine.models.bark.bark_layout import COARSE, SEMANTIC, BarkLayout
from cadenza.engine.models.bark.bark_stream import BarkStreamState, bark_state, state_bytes
from cadenza.engine.models.bark.bark_windows import semantic_prompt
from cadenza.engine.models.model import AudioTokenModel
from cadenza.engine.models.stream_state import StepStreams, StreamConditioning, StreamState
from cadenza.kernels.attention_backends import AttentionBackend, attention_backend_for
from cadenza.kernels.attention_context import AttentionContext

DEFAULT_VOICE = "default"
"""The voice name that means no preset: Bark then picks a speaker itself."""

FINE_TEMPERATURE = 0.5
"""Bark's fine-stage temperature when a request samples (``BarkModel.generate``'s default)."""


class BarkModel(AudioTokenModel):
    """Bark's three stages and its constants, served by the engine (see the module docstring).
    ``forward`` returns ``[S, 2, V]`` logits over :attr:`vocab_size` ids."""

    family = "bark"
    keeps_stream_state = True
    sampling_fields = frozenset({"fine_temperature"})
    segments_text = True
    # The ``bark`` package's temperature for the semantic and coarse stages, no other filter.
    default_sampling = SamplingParams(temperature=0.7, top_k=0)

    def __init__(self, bark: BarkCheckpoint, codec_name: str | None = None) -> None:
        super().__init__()
        semantic, coarse = bark.semantic.shape, bark.coarse.shape
        if (semantic.num_layers, semantic.num_heads, semantic.hidden_size) != (
            coarse.num_layers,
            coarse.num_heads,
            coarse.hidden_size,
        ):
            raise ValueError(
                "Bark's semantic and coarse stages must have the same shape to share the paged "
                f"KV (semantic {semantic}, coarse {coarse})"
            )
        self.semantic: BarkCausalGPT = bark.semantic
        self.coarse: BarkCausalGPT = bark.coarse
        self.fine: BarkFineGPT = bark.fine
        self.constants = bark.constants
        self.tokenizer = bark.tokenizer
        self.presets = bark.voices
        self.voices = (DEFAULT_VOICE, *sorted(bark.voices))
        self.codec_name = codec_name
        self.vocab_size = max(semantic.output_vocab_size, coarse.output_vocab_size)
        self.kv_spec = KVSpec(semantic.num_layers, semantic.num_heads, semantic.head_dim)
        self.layout = BarkLayout(
            bark.constants, self.vocab_size, coarse.output_vocab_size, bark.fine
        )
        self._backends: dict[str, AttentionBackend] = {}

    @property
    def default_duration_s(self) -> float:  # type: ignore[override]
        """The longest a stream speaks: Bark's semantic tokens at their rate."""
        return self.constants.max_new_semantic_tokens / self.constants.semantic_rate_hz

    @property
    def state_bytes_per_stream(self) -> int:
        return state_bytes(self.constants)

    # -- prompts and streams ------------------------------------------------------------------

    def text_ids(self, text: str) -> list[int]:
        """The tokenizer's ids for ``text``; ``ValueError`` for one longer than the semantic
        stage reads."""
        ids = list(self.tokenizer(text, add_special_tokens=False)["input_ids"])
        limit = self.constants.max_input_semantic_length
        if len(ids) > limit:
            raise ValueError(f"the text is {len(ids)} tokens; Bark reads at most {limit}")
        return ids

    def build_prompt(
        self, text: str, voice: str, prompt_codes: list[list[int]] | None = None
    ) -> list[list[int]]:
        """The semantic stage's prompt: the text's ids (shifted, padded), then the infer token;
        the voice's semantic history joins them in :meth:`forward`."""
        if prompt_codes:
            raise ValueError("Bark takes no speech prompt (its voices are presets)")
        ids, _ = semantic_prompt(self.text_ids(text), None, self.constants)
        rows = [[int(token), SEMANTIC] for token in ids]
        return [*rows, [self.constants.semantic_infer_token, SEMANTIC]]

    def check_request(self, text: str, sampling: SamplingParams) -> None:
        if not text.strip():
            raise ValueError("Bark needs some text to speak")
        self.text_ids(text)

    def begin_stream(self, conditioning: StreamConditioning) -> StreamState:
        voice = None if conditioning.voice == DEFAULT_VOICE else self.presets[conditioning.voice]
        sampling = conditioning.sampling
        fine = sampling.fine_temperature
        if fine is None:
            fine = 0.0 if sampling.greedy else FINE_TEMPERATURE
        return BarkStreamState.begin(voice, self.constants, fine or None)

    # -- the step -----------------------------------------------------------------------------

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        context: AttentionContext,
        kv_cache: PagedKVCache,
        logits_indices: torch.Tensor,
        *,
        streams: StepStreams | None = None,
    ) -> torch.Tensor:
        if streams is None:
            raise TypeError("Bark needs its streams' state (StepStreams) with every step")
        tokens = input_ids[:, 0]
        coarse = input_ids[:, 1] == COARSE
        stages = _StageRows(coarse)
        semantic_gpt, coarse_gpt = self.semantic, self.coarse
        x = stages.apply(
            tokens, semantic_gpt.input_embeds_layer, coarse_gpt.input_embeds_layer
        ) + stages.apply(
            positions, semantic_gpt.position_embeds_layer, coarse_gpt.position_embeds_layer
        )
        x = x + self._history_embeddings(streams, positions, coarse)
        backend = self._backends.get(x.device.type)
        if backend is None:
            backend = self._backends[x.device.type] = attention_backend_for(x.device)
        shape = semantic_gpt.shape
        scale = 1.0 / math.sqrt(shape.head_dim)
        pairs = zip(semantic_gpt.blocks(), coarse_gpt.blocks(), strict=True)
        for index, (semantic_block, coarse_block) in enumerate(pairs):
            qkv = stages.apply(x, semantic_block.attention_input, coarse_block.attention_input)
            q, k, v = qkv.view(-1, 3, shape.num_heads, shape.head_dim).unbind(1)
            k_cache, v_cache = kv_cache.layer(index)
            k_scale, v_scale = kv_cache.layer_scales(index)
            out = backend.forward(
                q, k, v, k_cache, v_cache, context, scale, k_scale, v_scale, index
            ).reshape(-1, shape.hidden_size)
            x = x + stages.apply(out, semantic_block.attn.out_proj, coarse_block.attn.out_proj)
            x = x + stages.apply(x, semantic_block.feed_forward, coarse_block.feed_forward)
        last = x[logits_indices]
        at_coarse = coarse[logits_indices]
        logits = last.new_zeros((last.shape[0], 2, self.vocab_size), dtype=torch.float32)
        logits[:, 0] = float("-inf")
        for model, rows in ((self.semantic, ~at_coarse), (self.coarse, at_coarse)):
            if bool(rows.any()):
                head = model.lm_head(model.layernorm_final(last[rows])).float()
                logits[rows, 0, : head.shape[-1]] = head
        return logits

    def _history_embeddings(
        self, streams: StepStreams, positions: torch.Tensor, coarse: torch.Tensor
    ) -> torch.Tensor | float:
        """Each token's voice history embedding where it lies in the semantic prompt's first
        ``max_input_semantic_length`` positions (``[N, H]``), or 0 when none of the step's
        tokens does."""
        limit = self.constants.max_input_semantic_length
        at_history = (positions < limit) & ~coarse
        if not bool(at_history.any()):
            return 0.0
        device = positions.device
        table = torch.stack([bark_state(state).semantic_history for state in streams.states])
        counts = torch.tensor(streams.token_counts)
        owner = torch.repeat_interleave(torch.arange(len(streams.states)), counts).to(device)
        rows = at_history.nonzero().squeeze(1)
        ids = table.to(device)[owner[rows], positions[rows]]
        hidden = self.semantic.shape.hidden_size
        embeds = torch.zeros(positions.shape[0], hidden, dtype=self.dtype, device=device)
        embeds[rows] = self.semantic.input_embeds_layer(ids).to(self.dtype)
        return embeds


class _StageRows:
    """Which of a step's tokens each stage reads (:meth:`apply` runs each stage's function on
    its own tokens only, and skips the split when they all belong to one stage)."""

    def __init__(self, coarse: torch.Tensor) -> None:
        self.all_coarse = bool(coarse.all())
        self.all_semantic = not bool(coarse.any())
        self.coarse = coarse.nonzero().squeeze(1)
        self.semantic = (~coarse).nonzero().squeeze(1)

    def apply(
        self,
        rows: torch.Tensor,
        semantic: Callable[[torch.Tensor], torch.Tensor],
        coarse: Callable[[torch.Tensor], torch.Tensor],
    ) -> torch.Tensor:
        """``rows [N, ...]`` -> ``[N, ...]``: the semantic tokens' rows through ``semantic``,
        the coarse tokens' through ``coarse``."""
        if self.all_semantic:
            return semantic(rows)
        if self.all_coarse:
            return coarse(rows)
        first = semantic(rows[self.semantic])
        out = first.new_empty((rows.shape[0], *first.shape[1:]))
        out[self.semantic] = first
        out[self.coarse] = coarse(rows[self.coarse])
        return out
