"""A contiguous KV cache for one sequence: the skeleton engine's memory.

Every layer gets a preallocated ``[max_tokens, num_kv_heads, head_dim]`` pair. A forward pass
over ``T`` new tokens writes them at ``num_tokens .. num_tokens+T-1`` and then advances
``num_tokens`` once, after all layers ran (:meth:`commit`).
"""

from __future__ import annotations

import torch


class SequenceKVCache:
    """Keys and values of one sequence, all layers, in contiguous preallocated tensors."""

    def __init__(
        self,
        num_layers: int,
        max_tokens: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        shape = (num_layers, max_tokens, num_kv_heads, head_dim)
        self.keys = torch.empty(shape, dtype=dtype, device=device)
        self.values = torch.empty(shape, dtype=dtype, device=device)
        self.max_tokens = max_tokens
        self.num_tokens = 0
        self._pending = 0

    def write(
        self, layer: int, k: torch.Tensor, v: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Store ``T`` new ``[T, Hkv, D]`` keys/values; return views of all keys/values so far."""
        start = self.num_tokens
        end = start + k.shape[0]
        if end > self.max_tokens:
            raise ValueError(f"sequence of {end} tokens exceeds the cache's {self.max_tokens}")
        self.keys[layer, start:end] = k
        self.values[layer, start:end] = v
        self._pending = end - start
        return self.keys[layer, :end], self.values[layer, :end]

    def commit(self) -> None:
        """Mark the tokens of the last forward pass as cached (call once per forward)."""
        self.num_tokens += self._pending
        self._pending = 0

    @property
    def nbytes(self) -> int:
        return self.keys.nbytes + self.values.nbytes
