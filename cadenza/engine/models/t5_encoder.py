"""The T5 text encoder (``transformers``' ``T5EncoderModel``), as an encoder-decoder family runs
it once per stream over one unpadded text.

Per block: RMS layer norm (T5's: no mean, no bias), bidirectional self-attention with no
``1/sqrt(d)`` scaling and a learned relative-position bias (computed by block 0 from
bucketed distances, shared by every block), residual; RMS norm, feed-forward (``relu``,
``gelu``, or a gated variant such as ``gated-gelu``, as ``feed_forward_proj`` names it),
residual; a final RMS norm. No absolute positions, no embedding scale.

Parameter names follow ``T5EncoderModel`` (``shared``, ``encoder.block.0.layer.0.SelfAttention.q``
...), so a checkpoint's tensors load one to one.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.nn import functional

from cadenza.engine.models.llama import RMSNorm


def _gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    return functional.gelu(x, approximate="tanh")


ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "relu": functional.relu,
    "gelu": functional.gelu,
    "gelu_new": _gelu_tanh,
    "gelu_pytorch_tanh": _gelu_tanh,
    "silu": functional.silu,
}
"""The feed-forward activations ``transformers``' ``ACT2FN`` names, by name."""


@dataclass(frozen=True)
class T5EncoderSpec:
    """A T5 encoder's shape: ``num_heads`` heads of ``d_kv`` each (``num_heads * d_kv`` need
    not be ``d_model``), ``activation`` one of :data:`ACTIVATIONS`, ``gated`` for the
    ``wi_0``/``wi_1`` feed-forward."""

    vocab_size: int
    d_model: int
    d_kv: int
    d_ff: int
    num_layers: int
    num_heads: int
    relative_attention_num_buckets: int
    relative_attention_max_distance: int
    layer_norm_epsilon: float
    activation: str
    gated: bool

    @staticmethod
    def from_config(config: dict[str, Any]) -> T5EncoderSpec:
        """The spec of a T5 ``config.json`` (or a composite model's ``text_encoder``);
        ``KeyError`` / ``ValueError`` for what is missing or unsupported. ``feed_forward_proj``
        is ``"{act}"`` or ``"gated-{act}"``; ``gated-gelu`` means the tanh GELU, as
        ``T5Config`` has it."""
        projection = str(config.get("feed_forward_proj", "relu"))
        parts = projection.split("-")
        gated = len(parts) == 2 and parts[0] == "gated"
        if len(parts) > 2 or (len(parts) == 2 and not gated):
            raise ValueError(f"feed_forward_proj {projection!r} is not 'act' or 'gated-act'")
        activation = "gelu_new" if projection == "gated-gelu" else parts[-1]
        if activation not in ACTIVATIONS:
            raise ValueError(f"T5 activation {activation!r} is not supported")
        return T5EncoderSpec(
            vocab_size=int(config["vocab_size"]),
            d_model=int(config["d_model"]),
            d_kv=int(config["d_kv"]),
            d_ff=int(config["d_ff"]),
            num_layers=int(config["num_layers"]),
            num_heads=int(config["num_heads"]),
            relative_attention_num_buckets=int(config.get("relative_attention_num_buckets", 32)),
            relative_attention_max_distance=int(config.get("relative_attention_max_distance", 128)),
            layer_norm_epsilon=float(config.get("layer_norm_epsilon", 1e-6)),
            activation=activation,
            gated=gated,
        )


def relative_position_bucket(
    relative_position: torch.Tensor, num_buckets: int, max_distance: int
) -> torch.Tensor:
    """T5's bidirectional bucket of each ``key - query`` distance: half the buckets for each
    direction; within one, exact buckets for distances below a quarter of the buckets, then
    logarithmic bins up to ``max_distance`` (all farther distances share the last)."""
    half = num_buckets // 2
    buckets = (relative_position > 0).to(torch.long) * half
    distance = torch.abs(relative_position)
    max_exact = half // 2
    is_small = distance < max_exact
    large = max_exact + (
        torch.log(distance.float() / max_exact)
        / math.log(max_distance / max_exact)
        * (half - max_exact)
    ).to(torch.long)
    large = torch.min(large, torch.full_like(large, half - 1))
    return buckets + torch.where(is_small, distance, large)


class T5Attention(nn.Module):
    def __init__(self, spec: T5EncoderSpec, relative_bias: bool) -> None:
        super().__init__()
        inner = spec.num_heads * spec.d_kv
        self.num_heads, self.d_kv = spec.num_heads, spec.d_kv
        self.q = nn.Linear(spec.d_model, inner, bias=False)
        self.k = nn.Linear(spec.d_model, inner, bias=False)
        self.v = nn.Linear(spec.d_model, inner, bias=False)
        self.o = nn.Linear(inner, spec.d_model, bias=False)
        if relative_bias:
            self.relative_attention_bias = nn.Embedding(
                spec.relative_attention_num_buckets, spec.num_heads
            )

    def forward(self, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        """``x [B, T, d_model]``, ``bias [1, heads, T, T]`` -> ``[B, T, d_model]``."""
        batch, length, _ = x.shape
        shape = (batch, length, self.num_heads, self.d_kv)
        q = self.q(x).view(shape).transpose(1, 2)
        k = self.k(x).view(shape).transpose(1, 2)
        v = self.v(x).view(shape).transpose(1, 2)
        out = functional.scaled_dot_product_attention(q, k, v, attn_mask=bias, scale=1.0)
        return self.o(out.transpose(1, 2).reshape(batch, length, -1))


class T5LayerSelfAttention(nn.Module):
    def __init__(self, spec: T5EncoderSpec, relative_bias: bool) -> None:
        super().__init__()
        self.SelfAttention = T5Attention(spec, relative_bias)
        self.layer_norm = RMSNorm(spec.d_model, spec.layer_norm_epsilon)

    def forward(self, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        return x + self.SelfAttention(self.layer_norm(x), bias)


class T5DenseActDense(nn.Module):
    def __init__(self, spec: T5EncoderSpec) -> None:
        super().__init__()
        self.wi = nn.Linear(spec.d_model, spec.d_ff, bias=False)
        self.wo = nn.Linear(spec.d_ff, spec.d_model, bias=False)
        self.act = ACTIVATIONS[spec.activation]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.wo(self.act(self.wi(x)))


class T5DenseGatedActDense(nn.Module):
    def __init__(self, spec: T5EncoderSpec) -> None:
        super().__init__()
        self.wi_0 = nn.Linear(spec.d_model, spec.d_ff, bias=False)
        self.wi_1 = nn.Linear(spec.d_model, spec.d_ff, bias=False)
        self.wo = nn.Linear(spec.d_ff, spec.d_model, bias=False)
        self.act = ACTIVATIONS[spec.activation]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.wo(self.act(self.wi_0(x)) * self.wi_1(x))


class T5LayerFF(nn.Module):
    def __init__(self, spec: T5EncoderSpec) -> None:
        super().__init__()
        self.DenseReluDense: nn.Module = (
            T5DenseGatedActDense(spec) if spec.gated else T5DenseActDense(spec)
        )
        self.layer_norm = RMSNorm(spec.d_model, spec.layer_norm_epsilon)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.DenseReluDense(self.layer_norm(x))


class T5Block(nn.Module):
    def __init__(self, spec: T5EncoderSpec, relative_bias: bool) -> None:
        super().__init__()
        self.layer = nn.ModuleList([T5LayerSelfAttention(spec, relative_bias), T5LayerFF(spec)])

    def forward(self, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        return self.layer[1](self.layer[0](x, bias))

    def relative_attention_bias(self) -> nn.Embedding:
        """The relative-position bias table (block 0 has it)."""
        attention = self.layer[0]
        assert isinstance(attention, T5LayerSelfAttention)
        return attention.SelfAttention.relative_attention_bias


class T5Stack(nn.Module):
    def __init__(self, spec: T5EncoderSpec) -> None:
        super().__init__()
        self.spec = spec
        self.block = nn.ModuleList(T5Block(spec, i == 0) for i in range(spec.num_layers))
        self.final_layer_norm = RMSNorm(spec.d_model, spec.layer_norm_epsilon)

    def position_bias(self, length: int, device: torch.device) -> torch.Tensor:
        """Block 0's relative-position bias for ``length`` tokens: ``[1, heads, T, T]``."""
        positions = torch.arange(length, dtype=torch.long, device=device)
        buckets = relative_position_bucket(
            positions[None, :] - positions[:, None],
            self.spec.relative_attention_num_buckets,
            self.spec.relative_attention_max_distance,
        )
        first = self.block[0]
        assert isinstance(first, T5Block)
        return first.relative_attention_bias()(buckets).permute(2, 0, 1)[None]


class T5Encoder(nn.Module):
    """``ids [B, T]`` (no padding: every token attends to every other) -> the last hidden
    state ``[B, T, d_model]``."""

    def __init__(self, spec: T5EncoderSpec) -> None:
        super().__init__()
        self.spec = spec
        self.shared = nn.Embedding(spec.vocab_size, spec.d_model)
        self.encoder = T5Stack(spec)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.shared(ids)
        stack = self.encoder
        bias = stack.position_bias(ids.shape[1], ids.device).to(x.dtype)
        for block in stack.block:
            x = block(x, bias)
        return stack.final_layer_norm(x)
