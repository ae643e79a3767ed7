"""The KV memory: every layer's keys and values in fixed-size pages, preallocated once.

``keys, values [num_layers, num_blocks, block_size, num_kv_heads, head_dim]``. Which page holds
which sequence's tokens is the block pool's business; this class only owns the tensors and
knows how many pages a byte budget buys. An int8 cache also holds ``key_scales, value_scales
[num_layers, num_blocks, block_size, num_kv_heads]`` (float16, one per token and head; see
:mod:`cadenza.kernels.kv_quant`), and counts them in its bytes per token.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from cadenza.kernels.kv_quant import SCALE_DTYPE


@dataclass(frozen=True)
class KVSpec:
    """The per-token KV shape of a model."""

    num_layers: int
    num_kv_heads: int
    head_dim: int

    def bytes_per_token(self, dtype: torch.dtype) -> int:
        element = torch.empty(0, dtype=dtype).element_size()
        values = 2 * self.num_layers * self.num_kv_heads * self.head_dim * element
        if dtype == torch.int8:
            scale = torch.empty(0, dtype=SCALE_DTYPE).element_size()
            values += 2 * self.num_layers * self.num_kv_heads * scale
        return values

    def bytes_per_block(self, block_size: int, dtype: torch.dtype) -> int:
        return block_size * self.bytes_per_token(dtype)


class PagedKVCache:
    def __init__(
        self,
        spec: KVSpec,
        num_blocks: int,
        block_size: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError("the KV cache needs at least one block of at least one token")
        shape = (spec.num_layers, num_blocks, block_size, spec.num_kv_heads, spec.head_dim)
        self.spec = spec
        self.num_blocks = num_blocks
        self.block_size = block_size
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
        block_size: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> PagedKVCache:
        """As many blocks as ``memory_bytes`` holds. Raises ``ValueError`` if not even one."""
        num_blocks = memory_bytes // spec.bytes_per_block(block_size, dtype)
        if num_blocks < 1:
            raise ValueError(
                f"KV budget of {memory_bytes} bytes holds no block of {block_size} tokens "
                f"({spec.bytes_per_block(block_size, dtype)} bytes each)"
            )
        return cls(spec, int(num_blocks), block_size, dtype, device)

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
