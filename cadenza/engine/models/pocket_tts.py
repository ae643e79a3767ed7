"""Kyutai Pocket TTS (``PocketTTSForConditionalGeneration``): a causal transformer whose hidden
state conditions a small flow head that samples one continuous audio latent a frame (12.5
frames a second), fed back as the next input; the audio tokenizer decodes the latents to
24 kHz audio. Served on the paged engine with its own sampler
(:attr:`~cadenza.engine.models.model.AudioTokenModel.samples_rows`).

A stream is one sequence of rows in the ``latents`` layout
(:mod:`~cadenza.engine.layouts.latent_rows`): the prompt as the checkpoint's chat template
renders it (a voice's latents, if any, in its audio-prompt positions, then the text), closed by
the BOS position from which the first frame is sampled; then one row per frame. The backbone
(LayerNorm, rotary attention, a GELU MLP) keeps its KV in the paged cache like any other, so
continuous batching, chunked prefill and the prefix cache (a voice's rows, shared by every
stream that speaks with it) work unchanged. Its forward returns, at each sampling position,
the normalised hidden state and the end-of-speech logit; :meth:`PocketTTSModel.sample_rows`
runs the flow head for every sampling stream in one batch: from Gaussian noise drawn from the
stream's own generator and scaled by ``sqrt(temperature)`` (zero at temperature 0, as
``transformers`` with ``do_sample=False``), ``num_flow_steps`` Euler steps of the LSD head (or
one call of a "drifting" head). End of speech follows the model's rule: from frame
``min_frames_before_eos`` on, the first frame whose logit exceeds ``eos_threshold`` is
followed by ``frames_after_eos`` more (the processor's count for the text's length), and the
stream makes at most ``ceil((text tokens / 3 + 2) * frame_rate)`` frames, ``generate``'s
default budget.

Parameter names follow ``transformers`` (``model.layers.0.self_attn.q_proj``,
``flow_head.layers.0.adaln_proj``, ``eos_head``, ``latent_mean``), so a checkpoint's tensors
load one to one (:mod:`~cadenza.engine.models.pocket_tts_checkpoint`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn

from cadenza.contract.sampling import SamplingParams
from cadenza.engine.kv.paged_kv_cache import KVSpec, PagedKVCache
from cadenza.engine.layouts.latent_rows import NOT_ENDED, LatentRowLayout, latent_bits, latents_of
from cadenza.engine.models.llama import LlamaBackboneConfig, LlamaDecoderLayer, RotaryEmbedding
from cadenza.engine.models.model import AudioTokenModel
from cadenza.engine.sequence import Sequence
from cadenza.kernels.attention_backends import AttentionBackend, attention_backend_for
from cadenza.kernels.attention_context import AttentionContext


@dataclass(frozen=True)
class FlowHeadSpec:
    """The flow head's shape (``flow_head_config``): ``flow_type`` ``"lsd"`` (conditioned on
    a flow step's start and end times, sampled by Euler steps) or ``"drifting"`` (noise to
    latent in one call, no time conditioning)."""

    hidden_size: int
    num_layers: int
    latent_dim: int
    condition_dim: int
    frequency_embedding_size: int
    layer_norm_eps: float
    rms_norm_eps: float
    max_period: float
    flow_type: str

    @property
    def num_time_conditions(self) -> int:
        return 2 if self.flow_type == "lsd" else 0


@dataclass(frozen=True)
class PocketTTSSpec:
    """A checkpoint's shape and the constants of its generation (``generation_config.json``
    and the processor's): the special ids of its prompt, the end-of-speech rule and the flow
    sampler's steps."""

    backbone: LlamaBackboneConfig  # attention shape, rope and MLP width (norms: LayerNorm)
    layer_norm_eps: float
    vocab_size: int
    latent_dim: int
    flow_head: FlowHeadSpec
    audio_prompt_id: int
    audio_latent_id: int
    audio_prompt_bos_id: int
    audio_bos_id: int
    frame_rate: float
    max_positions: int
    num_flow_steps: int = 1
    eos_threshold: float = -4.0
    min_frames_before_eos: int = 6
    sampling: SamplingParams = field(
        default_factory=lambda: SamplingParams(temperature=0.0, top_k=0)
    )

    @property
    def kv_spec(self) -> KVSpec:
        return self.backbone.kv_spec

    @property
    def placeholder_ids(self) -> frozenset[int]:
        """The prompt's audio positions, which are not text."""
        ids = (self.audio_prompt_id, self.audio_latent_id, self.audio_prompt_bos_id)
        return frozenset((*ids, self.audio_bos_id))

    def max_frames(self, prompt_ids: list[int]) -> int:
        """``generate``'s default frame budget for a prompt: ``ceil((text tokens / 3 + 2) *
        frame_rate)``."""
        text_tokens = sum(1 for token in prompt_ids if token not in self.placeholder_ids)
        return math.ceil((text_tokens / 3 + 2) * self.frame_rate)


@dataclass(frozen=True)
class PocketPrompts:
    """How a checkpoint's processor makes a prompt: ``render(text, voice_frames)`` the
    chat template's token ids for ``text`` with ``voice_frames`` audio-prompt positions (0:
    no voice), ending with the BOS position; ``frames_after_eos(ids)`` the frames made after
    the end of speech for that prompt (more for a short text)."""

    render: Callable[[str, int], list[int]]
    frames_after_eos: Callable[[list[int]], int]


# -- the backbone ---------------------------------------------------------------------------------


class PocketMLP(nn.Module):
    def __init__(self, hidden_size: int, intermediate_size: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.fc2 = nn.Linear(intermediate_size, hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = self.fc1(x)
        return self.fc2(nn.functional.gelu(hidden.to(x.dtype), approximate="tanh"))


class PocketDecoderLayer(LlamaDecoderLayer):
    """A Llama layer (pre-norm, rotary attention, residuals) with LayerNorms and a GELU MLP."""

    def __init__(self, config: LlamaBackboneConfig, eps: float, index: int) -> None:
        super().__init__(config, index)
        self.input_layernorm = nn.LayerNorm(config.hidden_size, eps=eps)  # type: ignore[assignment]
        self.post_attention_layernorm = nn.LayerNorm(config.hidden_size, eps=eps)  # type: ignore[assignment]
        self.mlp = PocketMLP(config.hidden_size, config.intermediate_size)  # type: ignore[assignment]


class PocketBackbone(nn.Module):
    """``PocketTTSModel``: token and latent embeddings in, normalised hidden states out."""

    def __init__(self, spec: PocketTTSSpec) -> None:
        super().__init__()
        config = spec.backbone
        self.spec = spec
        self.embed_tokens = nn.Embedding(spec.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(
            PocketDecoderLayer(config, spec.layer_norm_eps, i) for i in range(config.num_layers)
        )
        self.norm = nn.LayerNorm(config.hidden_size, eps=spec.layer_norm_eps)
        self.rotary = RotaryEmbedding(config.head_dim, config.rope_theta)
        self.audio_prompt_proj = nn.Linear(spec.latent_dim, config.hidden_size, bias=False)
        self.audio_latent_proj = nn.Linear(spec.latent_dim, config.hidden_size, bias=False)
        self.bos_latent = nn.Parameter(torch.zeros(spec.latent_dim))
        self._backends: dict[str, AttentionBackend] = {}

    def embed(self, rows: torch.Tensor) -> torch.Tensor:
        """Rows ``[N, D + 2]`` -> input embeddings ``[N, hidden]``: a text id's embedding, a
        voice frame through ``audio_prompt_proj``, a sampled latent (and the BOS position's
        learnt latent) through ``audio_latent_proj``."""
        spec = self.spec
        ids = rows[:, 0]
        embeddings = self.embed_tokens(ids)
        latents = rows[:, 1 : 1 + spec.latent_dim].to(torch.int32).contiguous().view(torch.float32)
        latents = latents.to(embeddings.dtype)
        voice = ids == spec.audio_prompt_id
        frames = ids == spec.audio_latent_id
        bos = ids == spec.audio_bos_id
        if bool(voice.any()):
            embeddings[voice] = self.audio_prompt_proj(latents[voice]).to(embeddings.dtype)
        if bool(frames.any()):
            embeddings[frames] = self.audio_latent_proj(latents[frames]).to(embeddings.dtype)
        if bool(bos.any()):
            bos_latent = self.bos_latent.to(self.audio_latent_proj.weight.dtype)
            embeddings[bos] = self.audio_latent_proj(bos_latent).to(embeddings.dtype)
        return embeddings

    fused_decode = None  # the fused native CPU step runs Llama backbones only

    def fuse_projections(self) -> int:
        """Fuse every layer's q/k/v into one matrix; returns how many modules were fused."""
        for layer in self.layers:
            assert isinstance(layer, PocketDecoderLayer)
            layer.self_attn.fuse_projections()
        return len(self.layers)

    def enable_fused_cpu_decode(self, weight_dtype: torch.dtype) -> bool:
        """The fused native step does not run this backbone (LayerNorm, a GELU MLP)."""
        return False

    def forward(
        self,
        embeddings: torch.Tensor,
        positions: torch.Tensor,
        context: AttentionContext,
        kv_cache: PagedKVCache,
    ) -> torch.Tensor:
        backend = self._backends.get(embeddings.device.type)
        if backend is None:
            backend = self._backends[embeddings.device.type] = attention_backend_for(
                embeddings.device
            )
        rotary = self.rotary(positions)
        x = embeddings
        for layer in self.layers:
            x = layer(x, rotary, kv_cache, context, backend)
        return self.norm(x)


# -- the flow head --------------------------------------------------------------------------------


class TimestepNorm(nn.Module):
    """The input over its standard deviation (unbiased, not centred), times a learnt weight."""

    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        variance = x.var(-1, keepdim=True) + self.eps
        return x * (self.weight * torch.rsqrt(variance))


class FlowLayerNorm(nn.LayerNorm):
    """``nn.LayerNorm`` written out as the reference's flow head computes it (same results
    to the bit as the reference, which fused layer norm is not)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mean = x.mean(-1, keepdim=True)
        variance = x.var(-1, unbiased=False, keepdim=True)
        x = (x - mean) * torch.rsqrt(variance + self.eps)
        if self.elementwise_affine:
            x = x * self.weight + self.bias
        return x


class TimestepEmbedding(nn.Module):
    """A flow time's sinusoidal embedding, a two-layer MLP and :class:`TimestepNorm`."""

    freqs: torch.Tensor

    def __init__(self, spec: FlowHeadSpec) -> None:
        super().__init__()
        half = spec.frequency_embedding_size // 2
        exponent = torch.arange(half, dtype=torch.float32) / half
        self.register_buffer("freqs", torch.exp(-math.log(spec.max_period) * exponent))
        self.fc1 = nn.Linear(spec.frequency_embedding_size, spec.hidden_size)
        self.fc2 = nn.Linear(spec.hidden_size, spec.hidden_size)
        self.norm = TimestepNorm(spec.hidden_size, spec.rms_norm_eps)

    def forward(self, times: torch.Tensor) -> torch.Tensor:
        angles = times * self.freqs.to(times.dtype)
        embedding = torch.cat([torch.cos(angles), torch.sin(angles)], dim=-1)
        return self.norm(self.fc2(nn.functional.silu(self.fc1(embedding))))


class FlowResBlock(nn.Module):
    """A residual MLP modulated by adaptive layer norm (shift, scale, gate)."""

    def __init__(self, spec: FlowHeadSpec) -> None:
        super().__init__()
        size = spec.hidden_size
        self.norm = FlowLayerNorm(size, eps=spec.layer_norm_eps)
        self.fc1 = nn.Linear(size, size)
        self.fc2 = nn.Linear(size, size)
        self.adaln_proj = nn.Linear(size, 3 * size)

    def forward(self, x: torch.Tensor, condition: torch.Tensor) -> torch.Tensor:
        shift, scale, gate = self.adaln_proj(nn.functional.silu(condition)).chunk(3, dim=-1)
        modulated = self.norm(x) * (1 + scale) + shift
        return x + gate * self.fc2(nn.functional.silu(self.fc1(modulated)))


class FlowFinalLayer(nn.Module):
    def __init__(self, spec: FlowHeadSpec) -> None:
        super().__init__()
        size = spec.hidden_size
        self.norm = FlowLayerNorm(size, eps=spec.layer_norm_eps, elementwise_affine=False)
        self.adaln_proj = nn.Linear(size, 2 * size)
        self.proj = nn.Linear(size, spec.latent_dim)

    def forward(self, x: torch.Tensor, condition: torch.Tensor) -> torch.Tensor:
        shift, scale = self.adaln_proj(nn.functional.silu(condition)).chunk(2, dim=-1)
        return self.proj(self.norm(x) * (1 + scale) + shift)


class FlowHead(nn.Module):
    """The velocity (LSD) or the latent (drifting) from a latent and the backbone's state."""

    def __init__(self, spec: FlowHeadSpec) -> None:
        super().__init__()
        self.spec = spec
        self.input_proj = nn.Linear(spec.latent_dim, spec.hidden_size)
        self.cond_proj = nn.Linear(spec.condition_dim, spec.hidden_size)
        self.timestep_embeddings = nn.ModuleList(
            TimestepEmbedding(spec) for _ in range(spec.num_time_conditions)
        )
        self.layers = nn.ModuleList(FlowResBlock(spec) for _ in range(spec.num_layers))
        self.final_layer = FlowFinalLayer(spec)

    def forward(
        self, latents: torch.Tensor, condition: torch.Tensor, times: list[torch.Tensor]
    ) -> torch.Tensor:
        hidden = self.input_proj(latents)
        condition = self.cond_proj(condition)
        if times:
            pairs = zip(self.timestep_embeddings, times, strict=True)
            embedded = [embedding(t) for embedding, t in pairs]
            total = embedded[0]
            for term in embedded[1:]:
                total = total + term
            condition = condition + total / len(times)
        for layer in self.layers:
            hidden = layer(hidden, condition)
        return self.final_layer(hidden, condition)

    def sample(self, condition: torch.Tensor, noise: torch.Tensor, steps: int) -> torch.Tensor:
        """The next latents ``[S, D]`` (normalised) from ``noise`` and the conditions."""
        if self.spec.flow_type == "drifting":
            return self.forward(noise, condition, [])
        latents = noise
        ones = torch.ones((noise.shape[0], 1), device=noise.device, dtype=noise.dtype)
        for step in range(steps):
            start, end = ones * (step / steps), ones * ((step + 1) / steps)
            latents = latents + self.forward(latents, condition, [start, end]) / steps
        return latents


# -- the model ------------------------------------------------------------------------------------


class PocketTTSModel(AudioTokenModel):
    """Pocket TTS on the paged engine (the module docstring); ``voices``: ``"default"`` (no
    voice prompt) and the checkpoint's presets, ``preset_latents`` their latents."""

    family = "pocket_tts"
    samples_rows = True

    latent_mean: torch.Tensor
    latent_std: torch.Tensor

    def __init__(
        self,
        spec: PocketTTSSpec,
        prompts: PocketPrompts,
        codec_name: str,
        preset_latents: dict[str, torch.Tensor] | None = None,
    ) -> None:
        super().__init__()
        self.spec = spec
        self.prompts = prompts
        self.codec_name = codec_name
        self.kv_spec = spec.kv_spec
        self.vocab_size = spec.vocab_size
        self.max_positions = spec.max_positions
        self.default_sampling = spec.sampling
        self.presets = dict(preset_latents or {})
        self.voices = ("default", *sorted(self.presets))
        self.model = PocketBackbone(spec)
        self.flow_head = FlowHead(spec.flow_head)
        self.eos_head = nn.Linear(spec.backbone.hidden_size, 1)
        self.register_buffer("latent_mean", torch.zeros(spec.latent_dim))
        self.register_buffer("latent_std", torch.ones(spec.latent_dim))
        dim = spec.latent_dim
        self.layout: LatentRowLayout = self.latent_layout(
            torch.zeros(dim, device="cpu"), torch.ones(dim, device="cpu")
        )

    def latent_layout(
        self, mean: torch.Tensor | None = None, std: torch.Tensor | None = None
    ) -> LatentRowLayout:
        """The ``latents`` layout with the latent statistics held now, or ``mean`` and ``std``
        (the loader sets :attr:`layout` to it again once the weights are in)."""
        return LatentRowLayout(
            self.spec.latent_dim,
            self.latent_mean if mean is None else mean,
            self.latent_std if std is None else std,
            frame_id=self.spec.audio_latent_id,
            bos_id=self.spec.audio_bos_id,
        )

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        context: AttentionContext,
        kv_cache: PagedKVCache,
        logits_indices: torch.Tensor,
    ) -> torch.Tensor:
        """What the sampler needs at ``logits_indices``: ``[S, 1, hidden + 1]``, the
        normalised hidden state then the end-of-speech logit."""
        hidden = self.model(self.model.embed(input_ids), positions, context, kv_cache)
        hidden = hidden[logits_indices]
        eos = self.eos_head(hidden)
        return torch.cat([hidden, eos.to(hidden.dtype)], dim=-1)[:, None, :]

    # -- prompts ---------------------------------------------------------------------------------

    def build_prompt(
        self, text: str, voice: str, prompt_codes: list[list[int]] | None = None
    ) -> list[list[int]]:
        """The chat template's prompt for ``text``, with the voice of a speech prompt (its
        latents, as the codec encodes them) or of preset ``voice``."""
        frames = prompt_codes
        if frames is None and voice != "default":
            frames = latent_bits(self.presets[voice])
        frames = frames or []
        ids = self.prompts.render(text, len(frames))
        if ids[-1] != self.spec.audio_bos_id:
            raise ValueError("the chat template's prompt must end with the first audio position")
        layout = self.layout
        voice_rows = iter(frames)
        rows = []
        for token in ids[:-1]:
            if token == self.spec.audio_prompt_id:
                rows.append(layout.latent_row(token, list(next(voice_rows))))
            else:
                rows.append(layout.text_row(token))
        max_frames = self.spec.max_frames(ids)
        rows.append(layout.bos_row(self.prompts.frames_after_eos(ids), max_frames))
        return rows

    def check_request(self, text: str, sampling: SamplingParams) -> None:
        if not text.strip():
            raise ValueError("Pocket TTS needs some text to speak")

    # -- sampling --------------------------------------------------------------------------------

    @torch.inference_mode()
    def sample_rows(self, outputs: torch.Tensor, seqs: list[Sequence]) -> list[list[int]]:
        spec = self.spec
        hidden_size = spec.backbone.hidden_size
        condition = outputs[:, 0, :hidden_size]
        eos_logits = outputs[:, 0, hidden_size].float().tolist()
        noise = torch.zeros(len(seqs), spec.latent_dim, dtype=torch.float32)
        for i, seq in enumerate(seqs):
            if not seq.sampling.greedy:
                draw = self._draw(seq)
                noise[i] = draw.cpu() * math.sqrt(seq.sampling.temperature)
        noise = noise.to(device=condition.device, dtype=condition.dtype)
        latents = self.flow_head.sample(condition, noise, spec.num_flow_steps)
        bits = latent_bits(latents)
        layout = self.layout
        rows = []
        for seq, latent, logit in zip(seqs, bits, eos_logits, strict=True):
            countdown = self._countdown(seq, logit)
            rows.append(layout.latent_row(spec.audio_latent_id, latent, countdown))
        return rows

    def replay_row(self, seq: Sequence, row: list[int]) -> None:
        layout = self.layout
        if row[0] != self.spec.audio_latent_id:
            raise ValueError("a generated row starts with the audio latent id")
        latent = latents_of([row[1 : 1 + self.spec.latent_dim]])
        if not bool(torch.isfinite(latent).all()):
            raise ValueError("a generated latent holds NaN or infinite values")
        before = layout.countdown(seq)
        frames_after_eos, _ = layout.stream_constants(seq)
        possible = {before - 1} if before > 0 else {NOT_ENDED, frames_after_eos}
        if row[-1] not in possible:
            raise ValueError(f"end-of-speech countdown {row[-1]} cannot follow {before}")
        if not seq.sampling.greedy:
            self._draw(seq)

    def _draw(self, seq: Sequence) -> torch.Tensor:
        """One frame's standard normal noise from ``seq``'s generator."""
        device = seq.generator.device
        return torch.randn(self.spec.latent_dim, generator=seq.generator, device=device)

    def _countdown(self, seq: Sequence, eos_logit: float) -> int:
        """The end-of-speech countdown of the frame ``seq`` samples now (the reference's
        ``PocketTTSEosThresholdCriteria``, spelled in the rows)."""
        layout = self.layout
        before = layout.countdown(seq)
        if before >= 0:
            return before - 1
        may_end = seq.num_generated >= self.spec.min_frames_before_eos
        if may_end and eos_logit > self.spec.eos_threshold:
            frames_after_eos, _ = layout.stream_constants(seq)
            return frames_after_eos
        return NOT_ENDED
