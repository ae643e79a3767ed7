"""What the fused CPU decode step (:mod:`cadenza.kernels.fused_cpu_decode`) reads from the model
and the cache it runs, as protocols: the kernels import no model family and no engine part.
A Llama-style backbone and the engine's paged KV cache satisfy them."""

from __future__ import annotations

from typing import Protocol

import torch
from torch import nn


class DecoderShape(Protocol):
    """A decoder's widths (the kernel takes multiples of 16)."""

    @property
    def hidden_size(self) -> int: ...

    @property
    def num_layers(self) -> int: ...

    @property
    def num_heads(self) -> int: ...

    @property
    def num_kv_heads(self) -> int: ...

    @property
    def head_dim(self) -> int: ...

    @property
    def intermediate_size(self) -> int: ...

    @property
    def rms_norm_eps(self) -> float: ...


class FusableDecoder(Protocol):
    """Pre-norm decoder layers with fused ``self_attn.qkv_proj`` / ``o_proj`` and
    ``mlp.gate_up_proj`` / ``down_proj``, RMS norms ``input_layernorm`` and
    ``post_attention_layernorm``; the final norm stays the model's."""

    layers: nn.ModuleList

    @property
    def config(self) -> DecoderShape: ...


class PagedCache(Protocol):
    """Keys and values in pages: ``keys`` / ``values`` ``[layers, pages, page_size, kv_heads,
    head_dim]``."""

    keys: torch.Tensor
    values: torch.Tensor
    page_size: int

    @property
    def dtype(self) -> torch.dtype: ...

    def layer(self, index: int) -> tuple[torch.Tensor, torch.Tensor]: ...
