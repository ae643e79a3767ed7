"""The scratch KV of a depth decoder: a frame's worth of positions per stream, reset every frame.

A depth decoder runs all of a step's streams in lockstep (every row at the same position), so
its KV needs no pool: row ``r`` of the batch owns page ``r`` of a small
:class:`~cadenza.engine.kv.paged_kv_cache.PagedKVCache` whose page holds one frame's positions.
Each call is a batch of *decode* tokens (the paged attention backends store every token's key
and value before attending), so a call may cover several consecutive positions of every row
(tokens ordered position-major) and the same kernels serve the backbone and the depth decoder.
Positions restart at 0 each frame and overwrite what the previous frame left.
"""

from __future__ import annotations

import torch

from cadenza.engine.kv.paged_kv_cache import KVSpec, PagedKVCache
from cadenza.kernels.attention_context import AttentionContext, decode_keys


class DepthScratch:
    def __init__(self, spec: KVSpec, positions: int) -> None:
        self.spec = spec
        self.positions = positions
        self.cache: PagedKVCache | None = None
        self._contexts: dict[tuple[int, int, int], AttentionContext] = {}

    def cache_for(self, rows: int, dtype: torch.dtype, device: torch.device) -> PagedKVCache:
        """A cache with a page for each of ``rows`` streams (grown, never shrunk)."""
        cache = self.cache
        if cache is None or cache.num_pages < rows or cache.dtype != dtype:
            pages = max(rows, 8 if cache is None else 2 * cache.num_pages)
            cache = self.cache = PagedKVCache(self.spec, pages, self.positions, dtype, device)
            self._contexts.clear()
        return cache

    def context(self, rows: int, start: int, count: int, device: torch.device) -> AttentionContext:
        """The context of ``count`` positions from ``start`` for ``rows`` streams (tokens
        position-major: every row's token at ``start``, then at ``start + 1``, ...)."""
        key = (rows, start, count)
        context = self._contexts.get(key)
        if context is not None:
            return context
        if start + count > self.positions:
            raise ValueError(f"depth position {start + count - 1} is past the frame's positions")
        row_index = torch.arange(rows, dtype=torch.int64, device=device).repeat(count)
        position = torch.arange(start, start + count, device=device).repeat_interleave(rows)
        page_tables = row_index.to(torch.int32)[:, None]
        seq_lens = (position + 1).to(torch.int32)
        keys = decode_keys(
            page_tables, seq_lens, self.positions, self.spec.num_kv_heads, start + count
        )
        context = AttentionContext(
            slot_mapping=row_index * self.positions + position,
            num_decodes=rows * count,
            decode_page_tables=page_tables,
            decode_seq_lens=seq_lens,
            prefills=(),
            decode_keys=keys,
            every_slot_set=True,
        )
        self._contexts[key] = context
        return context

    def positions_of(self, rows: int, start: int, count: int, device: torch.device) -> torch.Tensor:
        """The rotary positions of the tokens of :meth:`context`."""
        return torch.arange(start, start + count, device=device).repeat_interleave(rows)
