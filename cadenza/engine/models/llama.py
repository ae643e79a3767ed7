"""Llama-style decoder backbone: RMSNorm, rotary positions, grouped-query attention, SwiGLU.

Parameter names follow Hugging Face's ``LlamaModel`` (``layers.{i}.self_attn.q_proj`` …) so a
``LlamaForCausalLM`` checkpoint's tensors map onto it one to one. The backbone works on input
embeddings and returns final hidden states; each model family owns its embeddings and heads.
Tokens are flattened (``[num_tokens, hidden]``); there is no batch dimension.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from cadenza.engine.sequence_kv_cache import SequenceKVCache
from cadenza.kernels.attention import cached_causal_attention


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

    def __post_init__(self) -> None:
        if self.num_heads % self.num_kv_heads:
            raise ValueError("num_heads must be a multiple of num_kv_heads")
        if self.head_dim % 2:
            raise ValueError("head_dim must be even for rotary embeddings")

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
        dtype = x.dtype
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(dtype)


class RotaryEmbedding(nn.Module):
    """Rotary position embedding (the "rotate half" convention of Hugging Face Llama)."""

    inv_freq: torch.Tensor

    def __init__(self, head_dim: int, theta: float) -> None:
        super().__init__()
        exponent = torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim
        self.register_buffer("inv_freq", 1.0 / (theta**exponent), persistent=False)

    def forward(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``positions [T]`` -> ``cos, sin [T, 1, head_dim]`` (broadcast over heads)."""
        freqs = positions.float()[:, None] * self.inv_freq[None, :]
        angles = torch.cat([freqs, freqs], dim=-1)[:, None, :]
        return angles.cos(), angles.sin()


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return (x * cos + rotated * sin).to(x.dtype)


class LlamaAttention(nn.Module):
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

    def forward(
        self,
        x: torch.Tensor,
        rotary: tuple[torch.Tensor, torch.Tensor],
        kv_cache: SequenceKVCache,
    ) -> torch.Tensor:
        num_tokens = x.shape[0]
        q = self.q_proj(x).view(num_tokens, self.num_heads, self.head_dim)
        k = self.k_proj(x).view(num_tokens, self.num_kv_heads, self.head_dim)
        v = self.v_proj(x).view(num_tokens, self.num_kv_heads, self.head_dim)
        cos, sin = rotary
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        query_start = kv_cache.num_tokens
        all_k, all_v = kv_cache.write(self.layer_index, k, v)
        out = cached_causal_attention(q, all_k, all_v, query_start, self.scale)
        return self.o_proj(out.reshape(num_tokens, self.num_heads * self.head_dim))


class LlamaMLP(nn.Module):
    def __init__(self, config: LlamaBackboneConfig) -> None:
        super().__init__()
        d, f = config.hidden_size, config.intermediate_size
        self.gate_proj = nn.Linear(d, f, bias=False)
        self.up_proj = nn.Linear(d, f, bias=False)
        self.down_proj = nn.Linear(f, d, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))


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
        kv_cache: SequenceKVCache,
    ) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), rotary, kv_cache)
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaBackbone(nn.Module):
    """Decoder layers plus the final norm; embeddings in, hidden states out."""

    def __init__(self, config: LlamaBackboneConfig) -> None:
        super().__init__()
        self.config = config
        self.rotary = RotaryEmbedding(config.head_dim, config.rope_theta)
        self.layers = nn.ModuleList(
            LlamaDecoderLayer(config, index) for index in range(config.num_layers)
        )
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(
        self, embeddings: torch.Tensor, positions: torch.Tensor, kv_cache: SequenceKVCache
    ) -> torch.Tensor:
        """``embeddings [T, hidden]`` at ``positions [T]`` -> hidden states ``[T, hidden]``.

        Appends the ``T`` tokens' keys and values to ``kv_cache``.
        """
        rotary = self.rotary(positions)
        x = embeddings
        for layer in self.layers:
            x = layer(x, rotary, kv_cache)
        kv_cache.commit()
        return self.norm(x)
