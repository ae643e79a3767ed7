"""Bark's transformer stages in the ``transformers`` weight layout: a causal GPT (the semantic
and the coarse stage: learned positions, fused QKV, pre-LayerNorm blocks, exact GELU), whose
step over the engine's paged KV is :class:`~cadenza.engine.models.bark.bark_model.BarkModel`'s,
and the non-causal fine GPT with one embedding per codebook, run whole over a window.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

import torch
from torch import nn
from torch.nn import functional as F


@dataclass(frozen=True)
class GPTShape:
    """One stage's shape, from its sub-config in ``config.json``."""

    hidden_size: int
    num_heads: int
    num_layers: int
    block_size: int  # positions the stage was trained for
    input_vocab_size: int
    output_vocab_size: int
    bias: bool

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> GPTShape:
        return cls(
            hidden_size=int(config["hidden_size"]),
            num_heads=int(config["num_heads"]),
            num_layers=int(config["num_layers"]),
            block_size=int(config["block_size"]),
            input_vocab_size=int(config["input_vocab_size"]),
            output_vocab_size=int(config["output_vocab_size"]),
            bias=bool(config.get("bias", False)),
        )

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads


class _Attention(nn.Module):
    def __init__(self, shape: GPTShape) -> None:
        super().__init__()
        self.shape = shape
        self.att_proj = nn.Linear(shape.hidden_size, 3 * shape.hidden_size, bias=shape.bias)
        self.out_proj = nn.Linear(shape.hidden_size, shape.hidden_size, bias=shape.bias)

    def qkv(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``x [S, T, H]`` -> queries, keys, values, each ``[S, heads, T, head_dim]``."""
        s, t, _ = x.shape
        q, k, v = self.att_proj(x).split(self.shape.hidden_size, dim=2)
        heads, dim = self.shape.num_heads, self.shape.head_dim
        return (
            q.view(s, t, heads, dim).transpose(1, 2),
            k.view(s, t, heads, dim).transpose(1, 2),
            v.view(s, t, heads, dim).transpose(1, 2),
        )

    def merge(self, out: torch.Tensor) -> torch.Tensor:
        s, _, t, _ = out.shape
        return self.out_proj(out.transpose(1, 2).reshape(s, t, self.shape.hidden_size))


class _MLP(nn.Module):
    def __init__(self, shape: GPTShape) -> None:
        super().__init__()
        self.in_proj = nn.Linear(shape.hidden_size, 4 * shape.hidden_size, bias=shape.bias)
        self.out_proj = nn.Linear(4 * shape.hidden_size, shape.hidden_size, bias=shape.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out_proj(F.gelu(self.in_proj(x)))


class GPTBlock(nn.Module):
    layernorm_1: nn.LayerNorm
    attn: _Attention
    layernorm_2: nn.LayerNorm
    mlp: _MLP

    def __init__(self, shape: GPTShape, layer_norm_bias: bool) -> None:
        super().__init__()
        self.layernorm_1 = nn.LayerNorm(shape.hidden_size, bias=layer_norm_bias)
        self.attn = _Attention(shape)
        self.layernorm_2 = nn.LayerNorm(shape.hidden_size, bias=layer_norm_bias)
        self.mlp = _MLP(shape)

    def attention_input(self, x: torch.Tensor) -> torch.Tensor:
        """Fused queries, keys and values ``[N, 3H]`` of ``x [N, H]``."""
        return cast(torch.Tensor, self.attn.att_proj(self.layernorm_1(x)))

    def feed_forward(self, x: torch.Tensor) -> torch.Tensor:
        """The MLP's residual branch of ``x``."""
        return cast(torch.Tensor, self.mlp(self.layernorm_2(x)))


class BarkCausalGPT(nn.Module):
    """The semantic or coarse stage (``transformers`` ``BarkCausalModel`` weights)."""

    def __init__(self, shape: GPTShape) -> None:
        super().__init__()
        self.shape = shape
        self.input_embeds_layer = nn.Embedding(shape.input_vocab_size, shape.hidden_size)
        self.position_embeds_layer = nn.Embedding(shape.block_size, shape.hidden_size)
        self.layers = nn.ModuleList(
            [GPTBlock(shape, layer_norm_bias=shape.bias) for _ in range(shape.num_layers)]
        )
        self.layernorm_final = nn.LayerNorm(shape.hidden_size, bias=shape.bias)
        self.lm_head = nn.Linear(shape.hidden_size, shape.output_vocab_size, bias=False)

    def blocks(self) -> list[GPTBlock]:
        return [cast(GPTBlock, layer) for layer in self.layers]


class BarkFineGPT(nn.Module):
    """The fine stage (``transformers`` ``BarkFineModel`` weights): non-causal over a window of
    frames, predicting codebook ``c`` from the summed embeddings of codebooks ``0..c``."""

    def __init__(self, shape: GPTShape, n_codes_total: int, n_codes_given: int) -> None:
        super().__init__()
        self.shape = shape
        self.n_codes_given = n_codes_given
        self.input_embeds_layers = nn.ModuleList(
            [nn.Embedding(shape.input_vocab_size, shape.hidden_size) for _ in range(n_codes_total)]
        )
        self.position_embeds_layer = nn.Embedding(shape.block_size, shape.hidden_size)
        self.layers = nn.ModuleList(
            [GPTBlock(shape, layer_norm_bias=True) for _ in range(shape.num_layers)]
        )
        self.layernorm_final = nn.LayerNorm(shape.hidden_size)
        self.lm_heads = nn.ModuleList(
            [
                nn.Linear(shape.hidden_size, shape.output_vocab_size, bias=False)
                for _ in range(n_codes_given, n_codes_total)
            ]
        )

    def forward(self, codes: torch.Tensor, codebook: int) -> torch.Tensor:
        """``codes [S, T, n_codes_total]`` -> logits ``[S, T, V]`` of ``codebook``."""
        if not self.n_codes_given <= codebook < len(self.input_embeds_layers):
            raise ValueError(f"codebook {codebook} is not predicted by the fine stage")
        embeds = self.input_embeds_layers[0](codes[:, :, 0])
        for level in range(1, codebook + 1):
            embeds = embeds + self.input_embeds_layers[level](codes[:, :, level])
        positions = torch.arange(codes.shape[1], device=codes.device)
        hidden = embeds + self.position_embeds_layer(positions)[None]
        for layer in self.layers:
            block = cast(GPTBlock, layer)
            attn = block.attn
            q, k, v = attn.qkv(block.layernorm_1(hidden))
            hidden = hidden + attn.merge(F.scaled_dot_product_attention(q, k, v))
            hidden = hidden + block.mlp(block.layernorm_2(hidden))
        head = self.lm_heads[codebook - self.n_codes_given]
        return head(self.layernorm_final(hidden)).float()
