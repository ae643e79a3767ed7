"""Llama-style decoder backbone: RMSNorm, rotary positions, grouped-query attention, SwiGLU.

Parameter names follow Hugging Face's ``LlamaModel`` (``layers.{i}.self_attn.q_proj`` …) so a
``LlamaForCausalLM`` checkpoint's tensors map onto it one to one. The backbone works on input
embeddings and returns final hidden states; each model family owns its embeddings and heads.
Tokens are flattened (``[num_tokens, hidden]``, a step's whole batch); there is no batch
dimension. Attention reads and writes the paged KV cache through the attention backend.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from cadenza.engine.kv.paged_kv_cache import KVSpec, PagedKVCache
from cadenza.kernels.attention_backends import AttentionBackend, attention_backend_for
from cadenza.kernels.attention_context import AttentionContext
from cadenza.kernels.fused_cpu_decode import FusedCpuDecode


@dataclass(frozen=True)
class Llama3RopeScaling:
    """Llama 3.1's frequency-dependent stretch of the rotary frequencies."""

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position_embeddings: int


@dataclass(frozen=True)
class LlamaBackboneConfig:
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_llama3: Llama3RopeScaling | None = None

    def __post_init__(self) -> None:
        if self.num_heads % self.num_kv_heads:
            raise ValueError("num_heads must be a multiple of num_kv_heads")
        if self.head_dim % 2:
            raise ValueError("head_dim must be even for rotary embeddings")

    @property
    def kv_spec(self) -> KVSpec:
        return KVSpec(self.num_layers, self.num_kv_heads, self.head_dim)

    @property
    def num_parameters(self) -> int:
        d, f = self.hidden_size, self.intermediate_size
        q_out = self.num_heads * self.head_dim
        kv_out = self.num_kv_heads * self.head_dim
        per_layer = d * q_out * 2 + d * kv_out * 2 + 3 * d * f + 2 * d
        return self.num_layers * per_layer + d


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.float32 and self.weight.dtype == torch.float32:
            # One fused op, bit-identical to the steps below in float32.
            return nn.functional.rms_norm(x, self.weight.shape, self.weight, self.eps)
        dtype = x.dtype
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(dtype)


class RotaryEmbedding(nn.Module):
    """Rotary position embedding (the "rotate half" convention of Hugging Face Llama). The
    frequencies stay float32 whatever dtype the model is moved to (in bf16, angles at
    position 1,000 would be off by about a radian)."""

    inv_freq: torch.Tensor

    def __init__(
        self, head_dim: int, theta: float, llama3: Llama3RopeScaling | None = None
    ) -> None:
        super().__init__()
        exponent = torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim
        inv_freq = 1.0 / (theta**exponent)
        if llama3 is not None:
            inv_freq = _llama3_inv_freq(inv_freq, llama3)
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self._inv_freq32 = inv_freq

    def _apply(self, fn: Any, recurse: bool = True) -> RotaryEmbedding:
        super()._apply(fn, recurse)  # type: ignore[no-untyped-call]
        self.inv_freq = self._inv_freq32.to(self.inv_freq.device)
        return self

    def forward(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``positions [T]`` -> ``cos, signed_sin [T, 1, head_dim]`` (broadcast over heads):
        the angles' cosines, and their sines negated in the first half (what
        :func:`apply_rotary` multiplies the swapped halves by)."""
        freqs = positions.float()[:, None] * self.inv_freq[None, :]
        cos, sin = freqs.cos(), freqs.sin()
        return torch.cat([cos, cos], dim=-1)[:, None, :], torch.cat([-sin, sin], dim=-1)[:, None, :]


def _llama3_inv_freq(inv_freq: torch.Tensor, scaling: Llama3RopeScaling) -> torch.Tensor:
    """Long wavelengths are divided by ``factor``, short ones kept, the band between blended."""
    old_context = scaling.original_max_position_embeddings
    low_freq_wavelen = old_context / scaling.low_freq_factor
    high_freq_wavelen = old_context / scaling.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / scaling.factor, inv_freq)
    smooth = (old_context / wavelen - scaling.low_freq_factor) / (
        scaling.high_freq_factor - scaling.low_freq_factor
    )
    blended = (1 - smooth) * scaled / scaling.factor + smooth * scaled
    medium = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
    return torch.where(medium, blended, scaled)


def apply_rotary(
    x: torch.Tensor,
    cos: torch.Tensor,
    signed_sin: torch.Tensor,
    dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """Rotate ``x [..., head_dim]`` by :class:`RotaryEmbedding`'s angles: ``x * cos +
    rotate_half(x) * sin`` with ``rotate_half(x) = [-x2, x1]``, computed as ``[x2, x1]`` times
    the signed sines (the same products, bit for bit, with one op fewer). The result is in
    ``dtype`` (default: ``x``'s)."""
    half = x.shape[-1] // 2
    swapped = torch.cat([x[..., half:], x[..., :half]], dim=-1)
    return (x * cos + swapped * signed_sin).to(dtype or x.dtype)


class LlamaAttention(nn.Module):
    # Outputs that may stay in a packed product's compute dtype (cpu_linear): q and k are
    # rotated into the activation dtype, v is converted by the KV store, o_proj's output goes
    # into the residual add.
    linears_with_promoting_consumers = ("qkv_proj", "o_proj")

    def __init__(self, config: LlamaBackboneConfig, layer_index: int) -> None:
        super().__init__()
        d, hd = config.hidden_size, config.head_dim
        self.layer_index = layer_index
        self.num_heads = config.num_heads
        self.num_kv_heads = config.num_kv_heads
        self.head_dim = hd
        self.scale = hd**-0.5
        self.q_proj = nn.Linear(d, config.num_heads * hd, bias=False)
        self.k_proj = nn.Linear(d, config.num_kv_heads * hd, bias=False)
        self.v_proj = nn.Linear(d, config.num_kv_heads * hd, bias=False)
        self.o_proj = nn.Linear(config.num_heads * hd, d, bias=False)
        self.qkv_proj: nn.Module | None = None

    def fuse_projections(self) -> None:
        """Replace q, k and v projections by one matrix (one GEMM instead of three). The
        separate modules are dropped: call after loading weights."""
        weight = torch.cat([self.q_proj.weight, self.k_proj.weight, self.v_proj.weight])
        self.qkv_proj = nn.Linear(weight.shape[1], weight.shape[0], bias=False)
        self.qkv_proj.weight = nn.Parameter(weight.detach(), requires_grad=False)
        del self.q_proj, self.k_proj, self.v_proj

    def forward(
        self,
        x: torch.Tensor,
        rotary: tuple[torch.Tensor, torch.Tensor],
        kv_cache: PagedKVCache,
        context: AttentionContext,
        backend: AttentionBackend,
    ) -> torch.Tensor:
        num_tokens = x.shape[0]
        heads, kv_heads, head_dim = self.num_heads, self.num_kv_heads, self.head_dim
        cos, sin = rotary
        if self.qkv_proj is not None:
            # q and k sit side by side in the fused output: rotate them in one go.
            qkv = self.qkv_proj(x)
            qk = qkv[:, : (heads + kv_heads) * head_dim]
            qk = qk.reshape(num_tokens, heads + kv_heads, head_dim)
            rotated = apply_rotary(qk, cos, sin, x.dtype)
            q, k = rotated[:, :heads], rotated[:, heads:]
            v = qkv[:, (heads + kv_heads) * head_dim :].reshape(num_tokens, kv_heads, head_dim)
        else:
            q = apply_rotary(self.q_proj(x).reshape(num_tokens, heads, head_dim), cos, sin, x.dtype)
            k = apply_rotary(
                self.k_proj(x).reshape(num_tokens, kv_heads, head_dim), cos, sin, x.dtype
            )
            v = self.v_proj(x).reshape(num_tokens, kv_heads, head_dim)
        k_cache, v_cache = kv_cache.layer(self.layer_index)
        k_scale, v_scale = kv_cache.layer_scales(self.layer_index)
        out = backend.forward(
            q, k, v, k_cache, v_cache, context, self.scale, k_scale, v_scale, self.layer_index
        )
        return self.o_proj(out.reshape(num_tokens, self.num_heads * self.head_dim))


class LlamaMLP(nn.Module):
    # gate/up feed SiLU and the product, computed in the activations' dtype; down_proj's
    # output goes into the residual add.
    linears_with_promoting_consumers = ("gate_up_proj", "down_proj")

    def __init__(self, config: LlamaBackboneConfig) -> None:
        super().__init__()
        d, f = config.hidden_size, config.intermediate_size
        self.gate_proj = nn.Linear(d, f, bias=False)
        self.up_proj = nn.Linear(d, f, bias=False)
        self.down_proj = nn.Linear(f, d, bias=False)
        self.gate_up_proj: nn.Module | None = None

    def fuse_projections(self) -> None:
        """Replace gate and up projections by one matrix (call after loading weights)."""
        weight = torch.cat([self.gate_proj.weight, self.up_proj.weight])
        self.gate_up_proj = nn.Linear(weight.shape[1], weight.shape[0], bias=False)
        self.gate_up_proj.weight = nn.Parameter(weight.detach(), requires_grad=False)
        del self.gate_proj, self.up_proj

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gate_up_proj is not None:
            gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        else:
            gate, up = self.gate_proj(x), self.up_proj(x)
        if gate.dtype != x.dtype:
            # A product left its compute dtype (bf16 under float32 activations): SiLU and the
            # product in the activations' dtype (``up`` is promoted), so the down product's
            # input is rounded once, as if the outputs had been converted first.
            gate = gate.to(x.dtype)
        return self.down_proj(nn.functional.silu(gate) * up)


class LlamaDecoderLayer(nn.Module):
    def __init__(self, config: LlamaBackboneConfig, layer_index: int) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = LlamaAttention(config, layer_index)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = LlamaMLP(config)

    def forward(
        self,
        x: torch.Tensor,
        rotary: tuple[torch.Tensor, torch.Tensor],
        kv_cache: PagedKVCache,
        context: AttentionContext,
        backend: AttentionBackend,
    ) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), rotary, kv_cache, context, backend)
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaBackbone(nn.Module):
    """Decoder layers plus the final norm; embeddings in, hidden states out. With
    :attr:`fused_decode` set (:meth:`enable_fused_cpu_decode`), a CPU step runs every layer
    for all its tokens in one native call. A
    :class:`~cadenza.engine.models.model.ServingBackbone`."""

    def __init__(self, config: LlamaBackboneConfig) -> None:
        super().__init__()
        self.config = config
        self.rotary = RotaryEmbedding(config.head_dim, config.rope_theta, config.rope_llama3)
        self._backends: dict[str, AttentionBackend] = {}
        self.layers = nn.ModuleList(
            LlamaDecoderLayer(config, index) for index in range(config.num_layers)
        )
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.fused_decode: FusedCpuDecode | None = None

    def forward(
        self,
        embeddings: torch.Tensor,
        positions: torch.Tensor,
        context: AttentionContext,
        kv_cache: PagedKVCache,
    ) -> torch.Tensor:
        """``embeddings [N, hidden]`` at ``positions [N]`` -> hidden states ``[N, hidden]``.

        Stores the tokens' keys and values in ``kv_cache`` at ``context.slot_mapping``.
        """
        rotary = self.rotary(positions)
        fused = self.fused_decode
        if fused is not None and fused.applies(embeddings, context, kv_cache):
            return self.norm(fused(embeddings, rotary, context, kv_cache))
        return self.norm(self._layers(embeddings, rotary, context, kv_cache))

    def fuse_projections(self) -> int:
        """Fuse q/k/v and gate/up in every layer (fewer, larger GEMMs for serving); returns
        how many modules were fused. Call after the weights are loaded."""
        modules = [m for m in self.layers.modules() if isinstance(m, LlamaAttention | LlamaMLP)]
        for module in modules:
            module.fuse_projections()
        return len(modules)

    def enable_fused_cpu_decode(self, weight_dtype: torch.dtype) -> bool:
        """Run CPU steps through :class:`~cadenza.kernels.fused_cpu_decode.FusedCpuDecode`
        where the kernel can run this shape and builds on this machine, multiplying in
        ``weight_dtype``; whether it will. Call after :meth:`fuse_projections`."""
        self.fused_decode = FusedCpuDecode.build(self, weight_dtype)
        return self.fused_decode is not None

    def _layers(
        self,
        x: torch.Tensor,
        rotary: tuple[torch.Tensor, torch.Tensor],
        context: AttentionContext,
        kv_cache: PagedKVCache,
    ) -> torch.Tensor:
        """Every layer on torch (the attention backend of ``x``'s device)."""
        backend = self._backends.get(x.device.type)
        if backend is None:
            backend = self._backends[x.device.type] = attention_backend_for(x.device)
        for layer in self.layers:
            x = layer(x, rotary, kv_cache, context, backend)
        return x
