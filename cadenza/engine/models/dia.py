"""Dia (Nari Labs): a byte-level text encoder and an audio decoder over nine DAC codebooks in a
delay pattern, with classifier-free guidance, served on the paged engine.

Each stream runs the encoder once (:meth:`DiaModel.begin_stream`): over its text's bytes (the
speaker tags ``[S1]``, ``[S2]`` one id each) for the conditional branch and, when guided, over
as many zeros for the unconditional one, as ``transformers`` does. Every decoder layer's
cross-attention keys and values of both branches are the stream's state
(:class:`DiaStreamState`). The decoder's self-attention KV is paged; the unconditional
branch's lives in layers ``L .. 2L-1`` of the same pages (the model's KV spec has ``2L``
layers, so admission prices both). A step runs both branches of every stream as one batch of
twice the rows; :meth:`DiaModel.process_logits` then mixes them exactly as ``transformers``'
Dia generation does: the guided logits ``cond + scale * (cond - uncond)`` pick the top-k
candidates (``top_k``, from ``generation_config.json`` unless the request sets it), the
conditional logits restricted to them are what is sampled, after Dia's end-of-speech filter
(only the first codebook may end; it ends exactly when the end is its best id). The delay
pattern (:class:`~cadenza.engine.layouts.delay_pattern.DelayPattern`: codebook ``k`` late by
``delay_pattern[k]``; at the end each codebook emits the end id as its delay comes, then pad)
makes the frames: before its first frame a codebook holds the start id (BOS), as the
processor's delayed prompt has it.

A voice is cloned from a clip and its transcript (Dia's audio prompt): ``transformers`` reads
the transcript followed by the text in the encoder and starts the decoder after the clip's DAC
frames, delayed (``DiaProcessor(text=transcript + text, audio=clip)``). Here the clip comes as
conversation turns (:attr:`takes_context`: their transcripts, then the text, joined by spaces,
are the encoder's text; their frames, in order, the clip) or as a speech prompt alone (the text
then begins with its transcript, as ``transformers`` takes it). The prompt is the BOS row and
the delay pattern's rows over the clip's frames; a late codebook's last clip frames are not in
those rows, and the stream's first ``max(delay_pattern)`` steps emit them where BOS would stand
(the layout's lead-in from :attr:`StreamConditioning.context_frames`), as the processor's
delay mask forces them. The stream's frames, and so its audio, are the new speech only: the
DAC decodes the generated frames alone, as ``DiaProcessor.batch_decode(...,
audio_prompt_len=...)`` does.

Parameter names follow ``DiaForConditionalGeneration`` (``model.encoder.layers.0...``,
``model.decoder.layers.0.cross_attention...``, ``logits_dense``), so a checkpoint's tensors
load one to one (:mod:`~cadenza.engine.models.dia_checkpoint`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional

from cadenza.contract.sampling import SamplingParams
from cadenza.engine.kv.paged_kv_cache import KVSpec, PagedKVCache
from cadenza.engine.layouts.delay_pattern import DelayPattern, DelayPatternLayout
from cadenza.engine.models.cross_attention import CrossKV, attend_streams
from cadenza.engine.models.guidance_branches import attend_both_branches
from cadenza.engine.models.llama import RMSNorm, RotaryEmbedding, apply_rotary
from cadenza.engine.models.model import AudioTokenModel, PromptTurn
from cadenza.engine.models.stream_state import StepStreams, StreamConditioning, StreamState
from cadenza.kernels.attention_backends import AttentionBackend, attention_backend_for
from cadenza.kernels.attention_context import AttentionContext

SPEAKER_TAGS = {"<pad>": 0, "[S1]": 1, "[S2]": 2}  # DiaTokenizer's added tokens
_TAG_PATTERN = re.compile("(" + "|".join(re.escape(tag) for tag in SPEAKER_TAGS) + ")")


def dia_text_ids(text: str) -> list[int]:
    """``DiaTokenizer``'s ids for ``text``: its UTF-8 bytes, each speaker tag one id."""
    ids: list[int] = []
    for piece in _TAG_PATTERN.split(text):
        if piece in SPEAKER_TAGS:
            ids.append(SPEAKER_TAGS[piece])
        else:
            ids.extend(piece.encode("utf-8"))
    return ids


def dia_encoder_text(text: str, transcripts: Sequence[str] = ()) -> str:
    """What Dia's encoder reads for ``text`` after clips with these ``transcripts``: the
    transcripts, then the text, stripped and joined by single spaces (``text`` as it is when
    there are none)."""
    if not transcripts:
        return text
    return " ".join(part.strip() for part in (*transcripts, text))


@dataclass(frozen=True)
class DiaStackSpec:
    """One transformer stack's shape (the encoder's or the decoder's)."""

    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    norm_eps: float
    rope_theta: float
    max_positions: int
    vocab_size: int


@dataclass(frozen=True)
class DiaSpec:
    """A Dia checkpoint's shape and its generation's constants."""

    encoder: DiaStackSpec
    decoder: DiaStackSpec
    cross_num_heads: int
    cross_num_kv_heads: int
    cross_head_dim: int
    num_channels: int
    delay_pattern: tuple[int, ...]
    bos_id: int
    eos_id: int
    pad_id: int
    guidance_scale: float | None  # generation_config.json's (None or 1: unguided)
    sampling: SamplingParams  # generation_config.json's temperature, top_k, top_p

    @property
    def kv_spec(self) -> KVSpec:
        """Paged self-attention KV: the conditional branch's layers, then the unconditional's."""
        d = self.decoder
        return KVSpec(2 * d.num_layers, d.num_kv_heads, d.head_dim)

    def state_bytes_per_stream(self, dtype: torch.dtype) -> int:
        """Cross-attention keys and values of both branches at the longest text."""
        size = torch.empty((), dtype=dtype).element_size()
        per_token = 2 * self.cross_num_kv_heads * self.cross_head_dim * size
        return 2 * self.decoder.num_layers * self.encoder.max_positions * per_token


@dataclass
class DiaStreamState:
    """A stream's cross-attention keys and values per decoder layer, for the conditional and
    the unconditional branch (the same tensors when unguided), and its guidance."""

    cond: list[CrossKV]
    uncond: list[CrossKV]
    guidance_scale: float | None  # None: unguided
    guidance_top_k: int | None  # None: no top-k filter on the guided logits
    nbytes: int


class DiaMLP(nn.Module):
    def __init__(self, hidden: int, intermediate: int) -> None:
        super().__init__()
        self.gate_up_proj = nn.Linear(hidden, 2 * intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(up * functional.silu(gate))


class DiaAttentionProjections(nn.Module):
    """q/k/v/o of one attention (no biases); keys and values may come from another width."""

    def __init__(self, hidden: int, kv_input: int, heads: int, kv_heads: int, dim: int) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = heads, kv_heads, dim
        self.q_proj = nn.Linear(hidden, heads * dim, bias=False)
        self.k_proj = nn.Linear(kv_input, kv_heads * dim, bias=False)
        self.v_proj = nn.Linear(kv_input, kv_heads * dim, bias=False)
        self.o_proj = nn.Linear(heads * dim, hidden, bias=False)


class DiaEncoderLayer(nn.Module):
    def __init__(self, spec: DiaStackSpec) -> None:
        super().__init__()
        self.pre_sa_norm = RMSNorm(spec.hidden_size, spec.norm_eps)
        self.self_attention = DiaAttentionProjections(
            spec.hidden_size, spec.hidden_size, spec.num_heads, spec.num_kv_heads, spec.head_dim
        )
        self.post_sa_norm = RMSNorm(spec.hidden_size, spec.norm_eps)
        self.mlp = DiaMLP(spec.hidden_size, spec.intermediate_size)

    def forward(self, x: torch.Tensor, rotary: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        """``x [B, T, H]`` of texts with no padding: bidirectional attention."""
        attn = self.self_attention
        batch, length, _ = x.shape
        h = self.pre_sa_norm(x)
        cos, sin = rotary
        q = apply_rotary(attn.q_proj(h).view(batch, length, -1, attn.head_dim), cos, sin)
        k = apply_rotary(attn.k_proj(h).view(batch, length, -1, attn.head_dim), cos, sin)
        v = attn.v_proj(h).view(batch, length, -1, attn.head_dim)
        out = functional.scaled_dot_product_attention(
            q.transpose(1, 2),
            k.transpose(1, 2),
            v.transpose(1, 2),
            scale=1.0,
            enable_gqa=attn.num_kv_heads != attn.num_heads,
        )
        x = x + attn.o_proj(out.transpose(1, 2).reshape(batch, length, -1))
        return x + self.mlp(self.post_sa_norm(x))


class DiaEncoder(nn.Module):
    def __init__(self, spec: DiaStackSpec) -> None:
        super().__init__()
        self.embedding = nn.Embedding(spec.vocab_size, spec.hidden_size)
        self.layers = nn.ModuleList(DiaEncoderLayer(spec) for _ in range(spec.num_layers))
        self.norm = RMSNorm(spec.hidden_size, spec.norm_eps)
        self.rotary = RotaryEmbedding(spec.head_dim, spec.rope_theta)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """``ids [B, T]`` -> ``[B, T, H]``."""
        x = self.embedding(ids)
        cos, sin = self.rotary(torch.arange(ids.shape[1], device=ids.device))
        rotary = (cos[None], sin[None])  # [1, T, 1, D]: broadcast over the batch and heads
        for layer in self.layers:
            x = layer(x, rotary)
        return self.norm(x)


class DiaMultiChannelEmbedding(nn.Module):
    """One table for every channel: channel ``c``'s id ``i`` is row ``c * vocab + i``; a
    row's embedding is the sum over its channels."""

    offsets: torch.Tensor

    def __init__(self, vocab: int, channels: int, hidden: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab * channels, hidden)
        self.register_buffer("offsets", torch.arange(channels) * vocab, persistent=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """``ids [N, C]`` -> ``[N, H]``."""
        return self.embed(ids + self.offsets).sum(dim=1)


class DiaDecoderLayer(nn.Module):
    def __init__(self, spec: DiaSpec, index: int) -> None:
        super().__init__()
        d, e = spec.decoder, spec.encoder
        self.index = index
        self.num_layers = d.num_layers
        self.self_attention = DiaAttentionProjections(
            d.hidden_size, d.hidden_size, d.num_heads, d.num_kv_heads, d.head_dim
        )
        self.cross_attention = DiaAttentionProjections(
            d.hidden_size,
            e.hidden_size,
            spec.cross_num_heads,
            spec.cross_num_kv_heads,
            spec.cross_head_dim,
        )
        self.pre_sa_norm = RMSNorm(d.hidden_size, d.norm_eps)
        self.pre_ca_norm = RMSNorm(d.hidden_size, d.norm_eps)
        self.pre_mlp_norm = RMSNorm(d.hidden_size, d.norm_eps)
        self.mlp = DiaMLP(d.hidden_size, d.intermediate_size)

    def forward(
        self,
        x: torch.Tensor,
        rotary: tuple[torch.Tensor, torch.Tensor],
        kv_cache: PagedKVCache,
        context: AttentionContext,
        backend: AttentionBackend,
        cross: tuple[list[CrossKV], list[CrossKV]],
        token_counts: tuple[int, ...],
    ) -> torch.Tensor:
        """``x [2N, H]``: the step's ``N`` tokens in the conditional branch, then the same
        tokens in the unconditional one."""
        n = x.shape[0] // 2
        attn = self.self_attention
        dim = attn.head_dim
        h = self.pre_sa_norm(x)
        cos, sin = rotary
        q = apply_rotary(attn.q_proj(h).view(2 * n, -1, dim), cos, sin)
        k = apply_rotary(attn.k_proj(h).view(2 * n, -1, dim), cos, sin)
        v = attn.v_proj(h).view(2 * n, -1, dim)
        out = attend_both_branches(
            q, k, v, kv_cache, context, backend, 1.0, self.index, self.num_layers
        )
        x = x + attn.o_proj(out.reshape(2 * n, -1))
        ca = self.cross_attention
        q = ca.q_proj(self.pre_ca_norm(x)).view(2 * n, -1, ca.head_dim)
        out = torch.cat(
            [
                attend_streams(q[:n], cross[0], token_counts, 1.0),
                attend_streams(q[n:], cross[1], token_counts, 1.0),
            ]
        )
        x = x + ca.o_proj(out.reshape(2 * n, -1))
        return x + self.mlp(self.pre_mlp_norm(x))


class DiaDecoder(nn.Module):
    def __init__(self, spec: DiaSpec) -> None:
        super().__init__()
        d = spec.decoder
        self.embeddings = DiaMultiChannelEmbedding(d.vocab_size, spec.num_channels, d.hidden_size)
        self.layers = nn.ModuleList(DiaDecoderLayer(spec, i) for i in range(d.num_layers))
        self.norm = RMSNorm(d.hidden_size, d.norm_eps)
        self.rotary = RotaryEmbedding(d.head_dim, d.rope_theta)

    def decoder_layers(self) -> list[DiaDecoderLayer]:
        return [layer for layer in self.layers if isinstance(layer, DiaDecoderLayer)]


class DiaEncoderDecoder(nn.Module):
    def __init__(self, spec: DiaSpec) -> None:
        super().__init__()
        self.encoder = DiaEncoder(spec.encoder)
        self.decoder = DiaDecoder(spec)


class DiaModel(AudioTokenModel):
    """Dia on the engine (see the module docstring): ``forward`` returns ``[S, 2C, V]``, the
    conditional branch's ``C`` channels then the unconditional one's, which
    :meth:`process_logits` turns into the ``[S, C, V]`` that are sampled."""

    family = "dia"
    keeps_stream_state = True
    takes_context = True  # a voice to clone: clips and their transcripts
    sampling_fields = frozenset({"guidance_scale"})

    def __init__(self, spec: DiaSpec, codec_name: str | None = None) -> None:
        super().__init__()
        self.spec = spec
        d = spec.decoder
        self.model = DiaEncoderDecoder(spec)
        self.logits_dense = nn.Linear(d.hidden_size, spec.num_channels * d.vocab_size, bias=False)
        self.pattern = pattern = DelayPattern(
            spec.num_channels,
            spec.pad_id,
            delays=spec.delay_pattern,
            start_id=spec.bos_id,
            end_id=spec.eos_id,
        )
        self.layout = DelayPatternLayout(
            spec.num_channels,
            codebook_size=spec.eos_id,
            pad_id=spec.pad_id,
            eos_id=spec.eos_id,
            pattern=pattern,
            vocab_size=d.vocab_size,
        )
        self.kv_spec = spec.kv_spec
        self.vocab_size = d.vocab_size
        self.codec_name = codec_name
        self.eos_ids = frozenset({spec.eos_id})
        self.default_sampling = spec.sampling
        self.max_positions = d.max_positions
        self._backends: dict[str, AttentionBackend] = {}

    @property
    def state_bytes_per_stream(self) -> int:
        return self.spec.state_bytes_per_stream(self.dtype)

    # -- prompts and streams ------------------------------------------------------------------

    def build_prompt(
        self, text: str, voice: str, prompt_codes: list[list[int]] | None = None
    ) -> list[list[int]]:
        """The decoder's first row (BOS in every channel), then a speech prompt's frames in
        the delay pattern (a clip whose transcript begins ``text``, as ``transformers`` takes
        an audio prompt); the text goes to the encoder."""
        return self._prompt_rows(prompt_codes or [])

    def build_prompt_with_context(
        self, text: str, voice: str, context: list[PromptTurn]
    ) -> list[list[int]]:
        """The turns' clips as Dia's audio prompt (see the module docstring): each turn needs
        its audio and its transcript, and the transcripts with the text must fit the encoder."""
        for index, (_, transcript, frames) in enumerate(context):
            if not frames:
                raise ValueError(
                    f"context turn {index} has no audio; Dia's context is clips to continue"
                )
            if not transcript.strip():
                raise ValueError(
                    f"context turn {index} has no transcript; Dia clones a voice from a clip "
                    "and the text it says"
                )
        transcripts = [transcript for _, transcript, _ in context]
        self._text_ids(dia_encoder_text(text, transcripts), "the transcripts and the text")
        return self._prompt_rows([frame for _, _, frames in context for frame in frames])

    def _prompt_rows(self, frames: list[list[int]]) -> list[list[int]]:
        channels = self.spec.num_channels
        if any(len(frame) != channels for frame in frames):
            raise ValueError(f"Dia's audio prompt takes frames of {channels} DAC codes")
        return [[self.spec.bos_id] * channels, *self.pattern.rows_over(frames)]

    def prefix_conditioning(self, conditioning: StreamConditioning) -> str:
        # An unguided stream's second branch is not the unconditional one: never shared.
        scale = self._guidance_scale(conditioning.sampling)
        text = dia_encoder_text(conditioning.text, conditioning.context_texts)
        return f"voice={conditioning.voice}\ntext={text}\nguidance={scale}"

    def check_request(self, text: str, sampling: SamplingParams) -> None:
        self._text_ids(text)
        scale = sampling.guidance_scale
        if scale is not None and scale != 1 and scale <= 1:
            raise ValueError("guidance_scale: Dia's guidance takes a scale above 1 (1: off)")

    def _guidance_scale(self, sampling: SamplingParams) -> float | None:
        """The stream's guidance scale (the checkpoint's unless the request sets one), or
        ``None`` when it is unguided (scale 1)."""
        scale = (
            self.spec.guidance_scale if sampling.guidance_scale is None else sampling.guidance_scale
        )
        return None if scale is None or scale == 1 else scale

    @torch.inference_mode()
    def begin_stream(self, conditioning: StreamConditioning) -> StreamState:
        sampling = conditioning.sampling
        scale = self._guidance_scale(sampling)
        guided = scale is not None
        text = dia_encoder_text(conditioning.text, conditioning.context_texts)
        ids = torch.tensor([self._text_ids(text)], device=self.device)
        if guided:
            ids = torch.cat([ids, torch.zeros_like(ids)])
        encoded = self.model.encoder(ids)
        cond: list[CrossKV] = []
        uncond: list[CrossKV] = []
        for layer in self.model.decoder.decoder_layers():
            ca = layer.cross_attention
            keys = ca.k_proj(encoded).view(ids.shape[0], ids.shape[1], -1, ca.head_dim)
            values = ca.v_proj(encoded).view(ids.shape[0], ids.shape[1], -1, ca.head_dim)
            keys, values = keys.transpose(1, 2), values.transpose(1, 2)
            cond.append(CrossKV(keys[0].contiguous(), values[0].contiguous()))
            uncond.append(CrossKV(keys[-1].contiguous(), values[-1].contiguous()))
        nbytes = sum(item.nbytes for item in cond)
        if guided:
            nbytes += sum(item.nbytes for item in uncond)
        top_k = sampling.top_k or None
        return DiaStreamState(cond, uncond, scale, top_k, nbytes)

    def _text_ids(self, text: str, what: str = "the text") -> list[int]:
        ids = dia_text_ids(text)
        if not ids:
            raise ValueError("Dia needs some text to speak")
        limit = self.spec.encoder.max_positions
        if len(ids) > limit:
            raise ValueError(f"{what}: {len(ids)} bytes; Dia's encoder reads at most {limit}")
        return ids

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
            raise TypeError("Dia needs its streams' state (StepStreams) with every step")
        states = [_dia_state(state) for state in streams.states]
        decoder = self.model.decoder
        x = decoder.embeddings(input_ids)
        x = torch.cat([x, x])
        cos, sin = decoder.rotary(positions)
        rotary = (torch.cat([cos, cos]), torch.cat([sin, sin]))
        backend = self._backends.get(x.device.type)
        if backend is None:
            backend = self._backends[x.device.type] = attention_backend_for(x.device)
        for index, layer in enumerate(decoder.decoder_layers()):
            cross = ([s.cond[index] for s in states], [s.uncond[index] for s in states])
            x = layer(x, rotary, kv_cache, context, backend, cross, streams.token_counts)
        n = input_ids.shape[0]
        rows = torch.cat([logits_indices, logits_indices + n])
        logits = self.logits_dense(decoder.norm(x[rows]))
        channels, vocab = self.spec.num_channels, self.vocab_size
        cond, uncond = logits.view(2, -1, channels, vocab)
        return torch.cat([cond, uncond], dim=1)

    def process_logits(self, logits: torch.Tensor, states: list[StreamState]) -> torch.Tensor:
        """``[S, 2C, V]`` -> ``[S, C, V]``: guidance, then the end-of-speech filter."""
        channels = self.spec.num_channels
        cond, uncond = logits[:, :channels].float(), logits[:, channels:].float()
        out = cond.clone()
        for row, state in enumerate(states):
            dia = _dia_state(state)
            if dia.guidance_scale is None:
                continue
            guided = cond[row] + (cond[row] - uncond[row]) * dia.guidance_scale
            if dia.guidance_top_k is not None:
                top = guided.topk(min(dia.guidance_top_k, guided.shape[-1]), dim=-1).indices
                outside = torch.ones_like(guided, dtype=torch.bool).scatter(-1, top, False)
                out[row] = cond[row].masked_fill(outside, float("-inf"))
            else:
                out[row] = guided
        return self._end_filter(out)

    def _end_filter(self, logits: torch.Tensor) -> torch.Tensor:
        """Dia's end-of-speech filter on ``[S, C, V]``: only channel 0 may end, no channel
        emits the special ids above the end, and a channel whose best id is the end emits
        it, while one whose best id is not never does."""
        eos = self.spec.eos_id
        logits[:, 1:, eos:] = float("-inf")
        logits[:, 0, eos + 1 :] = float("-inf")
        ends = logits.argmax(dim=-1) == eos
        logits[..., :eos].masked_fill_(ends[..., None], float("-inf"))
        logits[..., eos].masked_fill_(~ends, float("-inf"))
        return logits


def _dia_state(state: StreamState) -> DiaStreamState:
    if not isinstance(state, DiaStreamState):
        raise TypeError(f"not a Dia stream's state: {type(state).__name__}")
    return state
