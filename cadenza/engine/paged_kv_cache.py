"""The KV memory: every layer's keys and values in fixed-size pages, preallocated once.

``keys, values [num_layers, num_blocks, block_size, num_kv_heads, head_dim]``. Which page holds
which sequence's tokens is the block pool's business; this class only owns the tensors and
knows how many pages a byte budget buys.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class KVSpec:
    """The per-token KV shape of a model."""

    num_layers: int
    num_kv_heads: int
    head_dim: int

    def bytes_per_token(self, dtype: torch.dtype) -> int:
        element = torch.empty(0, dtype=dtype).element_size()
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * element

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
        self.keys = torch.zeros(shape, dtype=dtype, device=device)
        self.values = torch.zeros(shape, dtype=dtype, device=device)

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

    @property
    def nbytes(self) -> int:
        return self.keys.nbytes + self.values.nbytes
