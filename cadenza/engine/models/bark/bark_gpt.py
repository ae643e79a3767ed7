"""Bark's transformer stages in the ``transformers`` weight layout: a causal GPT (the semantic
and the coarse stage: learned positions, fused QKV, pre-LayerNorm blocks, exact GELU) over a
dense per-stream KV cache, and the non-causal fine GPT with one embedding per codebook.

The causal stage runs a batch of streams at once, each at its own position: a step is either
one new token for each of ``S`` streams or one prompt chunk of one stream (chunked prefill),
both through :meth:`BarkCausalGPT.forward`. Each stream's keys and values live in a slot of
:class:`StageKV`, written in place, read back up to the longest stream and masked per stream.
"""

from __future__ import annotations

import math
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


class _Block(nn.Module):
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


class StageKV:
    """Dense keys and values of one causal stage: ``slots`` streams of up to ``capacity``
    positions each. Slots are handed out and back by number; the pool grows when full."""

    def __init__(self, shape: GPTShape, capacity: int, device: torch.device, dtype: torch.dtype):
        self.shape = shape
        self.capacity = capacity
        self.device = device
        self.dtype = dtype
        self.keys = self._empty(0)
        self.values = self._empty(0)
        self._free: list[int] = []

    def _empty(self, slots: int) -> torch.Tensor:
        s = self.shape
        size = (s.num_layers, slots, s.num_heads, self.capacity, s.head_dim)
        return torch.zeros(size, device=self.device, dtype=self.dtype)

    @property
    def num_slots(self) -> int:
        return int(self.keys.shape[1])

    def take(self) -> int:
        """A free slot (its old contents are overwritten before they are read)."""
        if not self._free:
            grown = max(1, self.num_slots)
            self._free.extend(range(self.num_slots, self.num_slots + grown))
            self.keys = torch.cat([self.keys, self._empty(grown)], dim=1)
            self.values = torch.cat([self.values, self._empty(grown)], dim=1)
        return self._free.pop(0)

    def give_back(self, slot: int) -> None:
        if slot in self._free or not 0 <= slot < self.num_slots:
            raise ValueError(f"slot {slot} is not in use")
        self._free.append(slot)

    @property
    def slots_in_use(self) -> int:
        return self.num_slots - len(self._free)


class BarkCausalGPT(nn.Module):
    """The semantic or coarse stage (``transformers`` ``BarkCausalModel`` weights)."""

    def __init__(self, shape: GPTShape) -> None:
        super().__init__()
        self.shape = shape
        self.input_embeds_layer = nn.Embedding(shape.input_vocab_size, shape.hidden_size)
        self.position_embeds_layer = nn.Embedding(shape.block_size, shape.hidden_size)
        self.layers = nn.ModuleList(
            [_Block(shape, layer_norm_bias=shape.bias) for _ in range(shape.num_layers)]
        )
        self.layernorm_final = nn.LayerNorm(shape.hidden_size, bias=shape.bias)
        self.lm_head = nn.Linear(shape.hidden_size, shape.output_vocab_size, bias=False)

    def forward(
        self, embeds: torch.Tensor, slots: torch.Tensor, past: torch.Tensor, kv: StageKV
    ) -> torch.Tensor:
        """Run ``embeds [S, T, H]`` (token embeddings, positions not yet added) for streams in
        KV ``slots [S]`` that have ``past [S]`` positions cached; stores their keys and values
        and returns the logits ``[S, V]`` of each stream's last new position."""
        t = embeds.shape[1]
        steps = torch.arange(t, device=embeds.device)
        positions = past[:, None] + steps[None, :]  # [S, T]
        if int(positions.max()) >= min(self.shape.block_size, kv.capacity):
            raise ValueError(f"position {int(positions.max())} is past the stage's window")
        hidden = embeds + self.position_embeds_layer(positions)
        length = int(positions.max()) + 1
        keys_at = torch.arange(length, device=embeds.device)
        mask = keys_at[None, None, :] <= positions[:, :, None]  # [S, T, L]
        scale = 1.0 / math.sqrt(self.shape.head_dim)
        for index, layer in enumerate(self.layers):
            block = cast(_Block, layer)
            attn = block.attn
            q, k, v = attn.qkv(block.layernorm_1(hidden))
            kv.keys[index][slots[:, None], :, positions] = k.transpose(1, 2)
            kv.values[index][slots[:, None], :, positions] = v.transpose(1, 2)
            keys = kv.keys[index][slots, :, :length]
            values = kv.values[index][slots, :, :length]
            out = F.scaled_dot_product_attention(
                q, keys, values, attn_mask=mask[:, None], scale=scale
            )
            hidden = hidden + attn.merge(out)
            hidden = hidden + block.mlp(block.layernorm_2(hidden))
        last = self.layernorm_final(hidden[:, -1])
        return self.lm_head(last).float()


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
            [_Block(shape, layer_norm_bias=True) for _ in range(shape.num_layers)]
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
            block = cast(_Block, layer)
            attn = block.attn
            q, k, v = attn.qkv(block.layernorm_1(hidden))
            hidden = hidden + attn.merge(F.scaled_dot_product_attention(q, k, v))
            hidden = hidden + block.mlp(block.layernorm_2(hidden))
        head = self.lm_heads[codebook - self.n_codes_given]
        return head(self.layernorm_final(hidden)).float()
