"""The KV memory: every layer's keys and values in fixed-size pages, preallocated once.

``keys, values [num_layers, num_pages, page_size, num_kv_heads, head_dim]``. Which page holds
which sequence's tokens is the page pool's business; this class only owns the tensors and
knows how many pages a byte budget buys (:func:`~cadenza.contract.kv_memory.kv_bytes_per_token`,
the formula admission and ``cadenza plan`` use too). An int8 cache also holds ``key_scales,
value_scales [num_layers, num_pages, page_size, num_kv_heads]`` (float16, one per token and
head; see :mod:`cadenza.kernels.kv_quant`).

A cache made with ``pad_page`` has one page more than :attr:`PagedKVCache.num_pages`, at index
:attr:`PagedKVCache.pad_page`, that the pool never hands out: the padded rows of a fixed-shape
decode step (:mod:`cadenza.engine.static_decode`) write their keys there and read them back,
so they touch no sequence's KV.
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


CPU_KV_FRACTION = 0.05
"""The share of free memory the KV cache takes on the CPU when none is configured (the
rest is the OS's, the codec's and the edge's)."""
CUDA_KV_FRACTION = 0.9
"""The share of free device memory (after the weights) the KV cache takes on CUDA when none
is configured; the other tenth holds activations and a prefill's temporaries."""


def kv_budget_bytes(config: EngineConfig, device: torch.device, reserved: int = 0) -> int:
    """``engine.kv_cache_memory_bytes``; else ``engine.kv_cache_memory_fraction`` (by default
    :data:`CPU_KV_FRACTION` or :data:`CUDA_KV_FRACTION`) of the device's free memory, less
    ``reserved`` bytes that are not free yet but will be taken (the CUDA graphs)."""
    if config.kv_cache_memory_bytes:
        return config.kv_cache_memory_bytes
    fraction = config.kv_cache_memory_fraction
    if fraction is None:
        fraction = CUDA_KV_FRACTION if device.type == "cuda" else CPU_KV_FRACTION
    return max(int(available_memory_bytes(device) * fraction) - reserved, 0)


class PagedKVCache:
    def __init__(
        self,
        spec: KVSpec,
        num_pages: int,
        page_size: int,
        dtype: torch.dtype,
        device: torch.device,
        pad_page: bool = False,
    ) -> None:
        if num_pages < 1 or page_size < 1:
            raise ValueError("the KV cache needs at least one page of at least one token")
        allocated = num_pages + 1 if pad_page else num_pages
        shape = (spec.num_layers, allocated, page_size, spec.num_kv_heads, spec.head_dim)
        self.spec = spec
        self.num_pages = num_pages  # the pool's pages (the pad page is not one of them)
        self.pad_page: int | None = num_pages if pad_page else None
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
        pad_page: bool = False,
    ) -> PagedKVCache:
        """As many pages as ``memory_bytes`` holds (the pad page, with ``pad_page``, among
        them). Raises ``ValueError`` if not even one is left for the pool."""
        num_pages = memory_bytes // spec.bytes_per_page(page_size, dtype) - int(pad_page)
        if num_pages < 1:
            raise ValueError(
                f"KV budget of {memory_bytes} bytes holds no page of {page_size} tokens "
                f"({spec.bytes_per_page(page_size, dtype)} bytes each)"
            )
        return cls(spec, int(num_pages), page_size, dtype, device, pad_page)

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
