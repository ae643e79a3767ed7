"""The KV memory: every layer's keys and values in fixed-size pages, preallocated once.

``keys, values [num_layers, num_pages, page_size, num_kv_heads, head_dim]``. Which page holds
which sequence's tokens is the page pool's business; this class only owns the tensors and
knows how many pages a byte budget buys (:func:`~cadenza.contract.kv_memory.kv_bytes_per_token`,
the formula admission and ``cadenza plan`` use too). An int8 cache also holds ``key_scales,
value_scales [num_layers, num_pages, page_size, num_kv_heads]`` (float16, one per token and
head; see :mod:`cadenza.kernels.kv_quant`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from cadenza.config import EngineConfig
from cadenza.contract.kv_memory import kv_bytes_per_token
from cadenza.engine.device import available_memory_bytes, kv_dtype_name
from cadenza.kernels.kv_quant import SCALE_DTYPE


@dataclass(frozen=True)
class KVSpec:
    """The per-token KV shape of a model."""

    num_layers: int
    num_kv_heads: int
    head_dim: int

    def bytes_per_token(self, dtype: torch.dtype) -> int:
        return kv_bytes_per_token(
            self.num_layers, self.num_kv_heads, self.head_dim, kv_dtype_name(dtype)
        )

    def bytes_per_page(self, page_size: int, dtype: torch.dtype) -> int:
        return page_size * self.bytes_per_token(dtype)


def kv_budget_bytes(config: EngineConfig, device: torch.device) -> int:
    """``engine.kv_cache_memory_bytes``, or that share of the device's free memory."""
    if config.kv_cache_memory_bytes:
        return config.kv_cache_memory_bytes
    return int(available_memory_bytes(device) * config.kv_cache_memory_fraction)


class PagedKVCache:
    def __init__(
        self,
        spec: KVSpec,
        num_pages: int,
        page_size: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        if num_pages < 1 or page_size < 1:
            raise ValueError("the KV cache needs at least one page of at least one token")
        shape = (spec.num_layers, num_pages, page_size, spec.num_kv_heads, spec.head_dim)
        self.spec = spec
        self.num_pages = num_pages
        self.page_size = page_size
        self.dtype = dtype
        self.keys = torch.zeros(shape, dtype=dtype, device=device)
        self.values = torch.zeros(shape, dtype=dtype, device=device)
        self.key_scales: torch.Tensor | None = None
        self.value_scales: torch.Tensor | None = None
        if dtype == torch.int8:
            self.key_scales = torch.zeros(shape[:-1], dtype=SCALE_DTYPE, device=device)
            self.value_scales = torch.zeros(shape[:-1], dtype=SCALE_DTYPE, device=device)

    @classmethod
    def from_budget(
        cls,
        spec: KVSpec,
        memory_bytes: int,
        page_size: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> PagedKVCache:
        """As many pages as ``memory_bytes`` holds. Raises ``ValueError`` if not even one."""
        num_pages = memory_bytes // spec.bytes_per_page(page_size, dtype)
        if num_pages < 1:
            raise ValueError(
                f"KV budget of {memory_bytes} bytes holds no page of {page_size} tokens "
                f"({spec.bytes_per_page(page_size, dtype)} bytes each)"
            )
        return cls(spec, int(num_pages), page_size, dtype, device)

    def layer(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.keys[index], self.values[index]

    def layer_scales(self, index: int) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """The int8 cache's scales for one layer (``(None, None)`` for float caches)."""
        if self.key_scales is None or self.value_scales is None:
            return None, None
        return self.key_scales[index], self.value_scales[index]

    @property
    def nbytes(self) -> int:
        total = self.keys.nbytes + self.values.nbytes
        if self.key_scales is not None and self.value_scales is not None:
            total += self.key_scales.nbytes + self.value_scales.nbytes
        return total
