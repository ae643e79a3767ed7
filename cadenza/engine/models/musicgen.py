"""MusicGen (Meta, ``MusicgenForConditionalGeneration``): a T5 text encoder and a decoder over
``K`` EnCodec codebooks in a delay pattern, with classifier-free guidance, served on the paged
engine. A request's text is the music's description; its voice is ``"default"``.

Each stream runs the T5 encoder once (:meth:`MusicgenModel.begin_stream`) over its
description's tokens, unpadded (``transformers`` pads a batch on the right and masks the
padding, the same arithmetic), projects the states to the decoder's width
(``enc_to_dec_proj``, where the widths differ) and keeps every decoder layer's
cross-attention keys and values (:class:`MusicgenStreamState`). The unconditional branch of
the guidance is the decoder with its cross-attention blocks skipped: ``transformers`` feeds
it zero encoder states under an all-zero mask, and with the bias-free key, value and output
projections that block adds exactly 0 to the residual. It therefore depends on no text and
keeps no state.

The decoder's self-attention KV is paged; the unconditional branch's lives in layers
``L .. 2L-1`` of the same pages (the KV spec has ``2L`` layers), so a step runs both branches
of every stream as one batch of twice the rows, both fed the same (guided) tokens as
``transformers`` feeds them. :meth:`MusicgenModel.process_logits` mixes them exactly as
``ClassifierFreeGuidanceLogitsProcessor`` does: ``uncond + (cond - uncond) * scale`` on the
float32 logits (scale 1: the conditional logits alone).

Rows follow the delay pattern (:class:`~cadenza.engine.layouts.delay_pattern.DelayPattern`,
delays ``0 .. K-1``): the prompt is one row of the pad id (MusicGen's BOS), a codebook holds
the pad id before its first frame and after its last, and every stream runs exactly its
target frames (MusicGen has no end token): ``D * 50`` frames for ``D`` seconds at 32 kHz,
``D * 50 + K - 1`` steps, which is ``transformers``' ``max_new_tokens``. The EnCodec that
decodes the frames is the checkpoint's own (``audio_encoder.*``): the codec is named by the
checkpoint directory.

Parameter names follow ``MusicgenForConditionalGeneration`` (``text_encoder.*``,
``enc_to_dec_proj.*``, ``decoder.model.decoder.layers.0...``, ``decoder.lm_heads.0``), so a
checkpoint's tensors load one to one (:mod:`~cadenza.engine.models.musicgen_checkpoint`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from cadenza.contract.sampling import SamplingParams
from cadenza.engine.kv.paged_kv_cache import KVSpec, PagedKVCache
from cadenza.engine.layouts.delay_pattern import DelayPatternLayout
from cadenza.engine.models.cross_attention import CrossKV, attend_streams
from cadenza.engine.models.guidance_branches import attend_both_branches
from cadenza.engine.models.model import AudioTokenModel
from cadenza.engine.models.stream_state import StepStreams, StreamConditioning, StreamState
from cadenza.engine.models.t5_encoder import ACTIVATIONS, T5Encoder, T5EncoderSpec
from cadenza.kernels.attention_backends import AttentionBackend, attention_backend_for
from cadenza.kernels.attention_context import AttentionContext

TextTokenizer = Callable[[str], list[int]]
"""A description to the T5 encoder's ids (its pieces, then ``</s>``)."""


@dataclass(frozen=True)
class MusicgenDecoderSpec:
    """The decoder's shape: ``vocab_size`` codes a codebook (its heads' classes; the
    embeddings have one more row, the pad id ``vocab_size``)."""

    hidden_size: int
    num_layers: int
    num_heads: int
    ffn_dim: int
    num_codebooks: int
    vocab_size: int
    activation: str
    layer_norm_eps: float = 1e-5

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads


@dataclass(frozen=True)
class MusicgenSpec:
    """A MusicGen checkpoint's shape and its generation's constants. ``pad_id``: the pad,
    BOS and decoder-start id (``vocab_size``); ``max_text_tokens``: the longest description
    (in T5 tokens, ``</s>`` included) a stream may have, which bounds its state;
    ``guidance_scale``: ``generation_config.json``'s (``None`` or 1: unguided);
    ``default_duration_s``: what ``generate`` makes by default (its ``max_length``), the
    length of a stream whose request gives no ``max_duration_s`` (a description does not set
    the length)."""

    text_encoder: T5EncoderSpec
    decoder: MusicgenDecoderSpec
    projects: bool  # enc_to_dec_proj exists (the text encoder's width differs)
    pad_id: int
    max_text_tokens: int
    guidance_scale: float | None
    sampling: SamplingParams
    default_duration_s: float

    @property
    def kv_spec(self) -> KVSpec:
        """Paged self-attention KV: the conditional branch's layers, then the unconditional's."""
        d = self.decoder
        return KVSpec(2 * d.num_layers, d.num_heads, d.head_dim)

    def state_bytes_per_stream(self, dtype: torch.dtype) -> int:
        """Cross-attention keys and values of every layer at the longest description (the
        unconditional branch has none)."""
        size = torch.empty((), dtype=dtype).element_size()
        d = self.decoder
        return d.num_layers * self.max_text_tokens * 2 * d.hidden_size * size


@dataclass
class MusicgenStreamState:
    """A stream's cross-attention keys and values per decoder layer (the conditional branch's)
    and its guidance scale (``None``: unguided)."""

    cross: list[CrossKV]
    guidance_scale: float | None
    nbytes: int


def sinusoidal_positions(positions: torch.Tensor, dim: int) -> torch.Tensor:
    """MusicGen's position embeddings ``[N, dim]`` (float32) of ``positions [N]``:
    ``cat(cos(p * f), sin(p * f))`` with ``f_i = exp(-i * ln(10000) / (dim/2 - 1))``, computed
    as ``transformers`` builds its table (a zero column last for an odd ``dim``)."""
    half = dim // 2
    step = math.log(10000) / (half - 1)
    freqs = torch.exp(
        torch.arange(half, dtype=torch.int64, device=positions.device).float() * -step
    )
    angles = positions.to(torch.int64).float()[:, None] * freqs[None]
    table = torch.cat([torch.cos(angles), torch.sin(angles)], dim=1)
    if dim % 2:
        table = torch.cat([table, table.new_zeros(table.shape[0], 1)], dim=1)
    return table


class MusicgenAttention(nn.Module):
    """q/k/v/out projections of one attention, ``hidden -> hidden``, no biases."""

    def __init__(self, hidden: int, heads: int) -> None:
        super().__init__()
        self.num_heads, self.head_dim = heads, hidden // heads
        self.k_proj = nn.Linear(hidden, hidden, bias=False)
        self.v_proj = nn.Linear(hidden, hidden, bias=False)
        self.q_proj = nn.Linear(hidden, hidden, bias=False)
        self.out_proj = nn.Linear(hidden, hidden, bias=False)


class MusicgenDecoderLayer(nn.Module):
    """Pre-LayerNorm: causal self-attention, cross-attention (conditional rows only),
    feed-forward, each added to the residual."""

    def __init__(self, spec: MusicgenDecoderSpec, index: int) -> None:
        super().__init__()
        hidden = spec.hidden_size
        self.index, self.num_layers = index, spec.num_layers
        self.self_attn = MusicgenAttention(hidden, spec.num_heads)
        self.self_attn_layer_norm = nn.LayerNorm(hidden, eps=spec.layer_norm_eps)
        self.encoder_attn = MusicgenAttention(hidden, spec.num_heads)
        self.encoder_attn_layer_norm = nn.LayerNorm(hidden, eps=spec.layer_norm_eps)
        self.fc1 = nn.Linear(hidden, spec.ffn_dim, bias=False)
        self.fc2 = nn.Linear(spec.ffn_dim, hidden, bias=False)
        self.final_layer_norm = nn.LayerNorm(hidden, eps=spec.layer_norm_eps)
        self.activation = ACTIVATIONS[spec.activation]

    def forward(
        self,
        x: torch.Tensor,
        kv_cache: PagedKVCache,
        context: AttentionContext,
        backend: AttentionBackend,
        cross: list[CrossKV],
        token_counts: tuple[int, ...],
    ) -> torch.Tensor:
        """``x [2N, H]``: the step's ``N`` tokens in the conditional branch, then the same
        tokens in the unconditional one (stored in layer ``L + index`` of the pages)."""
        n = x.shape[0] // 2
        attn = self.self_attn
        heads, dim = attn.num_heads, attn.head_dim
        scale = dim**-0.5
        h = self.self_attn_layer_norm(x)
        q = attn.q_proj(h).view(2 * n, heads, dim)
        k = attn.k_proj(h).view(2 * n, heads, dim)
        v = attn.v_proj(h).view(2 * n, heads, dim)
        out = attend_both_branches(
            q, k, v, kv_cache, context, backend, scale, self.index, self.num_layers
        )
        x = x + attn.out_proj(out.reshape(2 * n, -1))
        ca = self.encoder_attn
        q = ca.q_proj(self.encoder_attn_layer_norm(x[:n])).view(n, heads, dim)
        attended = ca.out_proj(attend_streams(q, cross, token_counts, scale).reshape(n, -1))
        x = torch.cat([x[:n] + attended, x[n:]])
        return x + self.fc2(self.activation(self.fc1(self.final_layer_norm(x))))


class MusicgenDecoderStack(nn.Module):
    def __init__(self, spec: MusicgenDecoderSpec) -> None:
        super().__init__()
        self.embed_tokens = nn.ModuleList(
            nn.Embedding(spec.vocab_size + 1, spec.hidden_size) for _ in range(spec.num_codebooks)
        )
        self.layers = nn.ModuleList(MusicgenDecoderLayer(spec, i) for i in range(spec.num_layers))
        self.layer_norm = nn.LayerNorm(spec.hidden_size, eps=spec.layer_norm_eps)

    def cross_kv(self, memory: torch.Tensor) -> list[CrossKV]:
        """Every layer's cross-attention keys and values of one stream's encoder states
        ``memory [T, H]`` (``[heads, T, head_dim]`` each)."""
        cross: list[CrossKV] = []
        length = memory.shape[0]
        for layer in self.layers:
            assert isinstance(layer, MusicgenDecoderLayer)
            ca = layer.encoder_attn
            keys = ca.k_proj(memory).view(length, ca.num_heads, ca.head_dim).transpose(0, 1)
            values = ca.v_proj(memory).view(length, ca.num_heads, ca.head_dim).transpose(0, 1)
            cross.append(CrossKV(keys.contiguous(), values.contiguous()))
        return cross

    def embed(self, ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """``ids [N, K]`` at ``positions [N]`` -> ``[N, H]``: the codebooks' embeddings summed
        in codebook order, plus the sinusoidal position."""
        x = sum(table(ids[:, k]) for k, table in enumerate(self.embed_tokens))
        assert isinstance(x, torch.Tensor)
        width = self.layer_norm.normalized_shape[0]
        return x + sinusoidal_positions(positions, width).to(x.dtype)


class MusicgenDecoderModel(nn.Module):
    def __init__(self, spec: MusicgenDecoderSpec) -> None:
        super().__init__()
        self.decoder = MusicgenDecoderStack(spec)


class MusicgenCausalLM(nn.Module):
    """The decoder and its ``K`` heads (``lm_heads[k]``: codebook ``k``'s ``V`` classes)."""

    def __init__(self, spec: MusicgenDecoderSpec) -> None:
        super().__init__()
        self.model = MusicgenDecoderModel(spec)
        self.lm_heads = nn.ModuleList(
            nn.Linear(spec.hidden_size, spec.vocab_size, bias=False)
            for _ in range(spec.num_codebooks)
        )


class MusicgenModel(AudioTokenModel):
    """MusicGen on the engine (see the module docstring): ``forward`` returns ``[S, 2K, V]``,
    the conditional branch's ``K`` codebooks then the unconditional one's, which
    :meth:`process_logits` turns into the ``[S, K, V + 1]`` that are sampled (the last id,
    the pad, never: its logit is ``-inf``)."""

    family = "musicgen"
    keeps_stream_state = True
    sampling_fields = frozenset({"guidance_scale"})

    def __init__(
        self, spec: MusicgenSpec, tokenizer: TextTokenizer, codec_name: str | None = None
    ) -> None:
        super().__init__()
        self.spec = spec
        d = spec.decoder
        self.text_encoder = T5Encoder(spec.text_encoder)
        if spec.projects:
            self.enc_to_dec_proj = nn.Linear(spec.text_encoder.d_model, d.hidden_size)
        self.decoder = MusicgenCausalLM(spec.decoder)
        # MusicGen has no end token. The layout's end id is the pad id: the heads predict the
        # codes 0 .. V-1 only, so codebook 0 never emits it and every stream runs to its
        # target frames, after which the pattern forces the pad anyway. The sampled vocabulary
        # is V + 1 wide so that the pad has a place (process_logits gives it -inf).
        self.layout = DelayPatternLayout(
            d.num_codebooks,
            codebook_size=d.vocab_size,
            pad_id=spec.pad_id,
            eos_id=spec.pad_id,
            vocab_size=d.vocab_size + 1,
        )
        self.kv_spec = spec.kv_spec
        self.vocab_size = d.vocab_size + 1
        self.codec_name = codec_name
        self.default_sampling = spec.sampling
        self.default_duration_s = spec.default_duration_s
        self._tokenizer = tokenizer
        self._backends: dict[str, AttentionBackend] = {}

    @property
    def state_bytes_per_stream(self) -> int:
        return self.spec.state_bytes_per_stream(self.dtype)

    # -- prompts and streams ------------------------------------------------------------------

    def build_prompt(
        self, text: str, voice: str, prompt_codes: list[list[int]] | None = None
    ) -> list[list[int]]:
        """The decoder's first row (the pad id, MusicGen's BOS, in every codebook); the
        description goes to the encoder."""
        if prompt_codes:
            raise ValueError("MusicGen takes no audio prompt here; describe the music instead")
        return [[self.spec.pad_id] * self.spec.decoder.num_codebooks]

    def prefix_conditioning(self, conditioning: StreamConditioning) -> str:
        # An unguided stream's second branch is not the unconditional one: never shared.
        scale = self._guidance_scale(conditioning.sampling)
        return f"voice={conditioning.voice}\ntext={conditioning.text}\nguidance={scale}"

    def check_request(self, text: str, sampling: SamplingParams) -> None:
        self.text_ids(text)
        scale = sampling.guidance_scale
        if scale is not None and scale < 1:
            raise ValueError("guidance_scale: MusicGen's guidance takes a scale of at least 1")

    def text_ids(self, text: str) -> list[int]:
        """The T5 encoder's ids for ``text`` (its pieces, then ``</s>``); ``ValueError`` when
        longer than the stream state holds."""
        ids = self._tokenizer(text)
        limit = self.spec.max_text_tokens
        if len(ids) > limit:
            raise ValueError(
                f"the description is {len(ids)} tokens; MusicGen's text encoder reads at most "
                f"{limit}"
            )
        return ids

    @torch.inference_mode()
    def _guidance_scale(self, sampling: SamplingParams) -> float | None:
        """The stream's guidance scale (the checkpoint's unless the request sets one), or
        ``None`` when it is unguided (scale 1, or none at all)."""
        scale = (
            self.spec.guidance_scale if sampling.guidance_scale is None else sampling.guidance_scale
        )
        return None if scale is None or scale == 1 else scale

    def begin_stream(self, conditioning: StreamConditioning) -> StreamState:
        scale = self._guidance_scale(conditioning.sampling)
        ids = torch.tensor([self.text_ids(conditioning.text)], device=self.device)
        memory = self.text_encoder(ids)[0]
        if self.spec.projects:
            memory = self.enc_to_dec_proj(memory)
        cross = self.decoder.model.decoder.cross_kv(memory)
        nbytes = sum(item.nbytes for item in cross)
        return MusicgenStreamState(cross, scale, nbytes)

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
            raise TypeError("MusicGen needs its streams' state (StepStreams) with every step")
        states = [_musicgen_state(state) for state in streams.states]
        decoder = self.decoder.model.decoder
        x = decoder.embed(input_ids, positions)
        x = torch.cat([x, x])
        backend = self._backends.get(x.device.type)
        if backend is None:
            backend = self._backends[x.device.type] = attention_backend_for(x.device)
        for index, layer in enumerate(decoder.layers):
            cross = [state.cross[index] for state in states]
            x = layer(x, kv_cache, context, backend, cross, streams.token_counts)
        n = input_ids.shape[0]
        rows = torch.cat([logits_indices, logits_indices + n])
        hidden = decoder.layer_norm(x[rows])
        logits = torch.stack([head(hidden) for head in self.decoder.lm_heads], dim=1)
        cond, uncond = logits.view(2, -1, *logits.shape[1:])
        return torch.cat([cond, uncond], dim=1)

    def process_logits(self, logits: torch.Tensor, states: list[StreamState]) -> torch.Tensor:
        """``[S, 2K, V]`` -> ``[S, K, V + 1]``: each guided stream's
        ``uncond + (cond - uncond) * scale``, an unguided one's ``cond``; the pad's column
        ``-inf``."""
        codebooks = self.spec.decoder.num_codebooks
        cond, uncond = logits[:, :codebooks].float(), logits[:, codebooks:].float()
        out = torch.full((*cond.shape[:2], cond.shape[2] + 1), float("-inf"), device=cond.device)
        out[..., :-1] = cond
        for row, state in enumerate(states):
            scale = _musicgen_state(state).guidance_scale
            if scale is not None:
                out[row, :, :-1] = uncond[row] + (cond[row] - uncond[row]) * scale
        return out


def _musicgen_state(state: StreamState) -> MusicgenStreamState:
    if not isinstance(state, MusicgenStreamState):
        raise TypeError(f"not a MusicGen stream's state: {type(state).__name__}")
    return state
