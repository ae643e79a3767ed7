"""A dense copy of the decoding sequences' keys and values, kept between steps: the CPU's
decode attention reads it instead of gathering pages.

Gathering every decoding sequence's pages, for every layer of every step, costs more than the
attention itself once contexts grow: on the CPU, 16 streams at 800 positions spent about 1.3
of 1.7 ms per layer call copying keys (docs/journal/2026-12-01-dense-decode-copy.md). Each
decoding sequence instead owns a *row* of a dense tensor per layer,
``[rows, Hkv, capacity, D]``, one key head's positions contiguous (the layout SDPA reads), and
a step copies in only what changed: the one new token of a sequence that the copy already holds
up to its previous position, or the whole history of a sequence new to it (its first decode, or
after a prefill, a preemption or a step that did not use the copy).

The paged cache stays the source of truth. A step's copies read the pages *after* the
layer's new keys are stored, converting (or dequantizing an int8 cache) exactly as the
gathering path does, so a row holds what gathering its pages would give, and the attention
over it equals the gathering path's.

Bookkeeping: :meth:`DenseDecodeKV.plan`, once per step, gives each decoding sequence a row
(the lowest free one, zeroed: a masked position is still multiplied, and a stale NaN would
leak through the mask) and takes it from a sequence that prefills in the same step (its keys
are being recomputed); :meth:`DenseDecodeKV.retain`, after the step, releases the rows of
sequences that are no longer running. A running sequence that sits steps out keeps its row,
and the copy checks every row's length before appending, so a row that missed tokens (steps
that gathered, a prefill in a step without decodes) is copied anew rather than trusted. A plan
records the rows' new lengths: the caller must run :meth:`DenseDecodeStep.attend` for every
layer, or :meth:`DenseDecodeKV.release` the step's sequences if the forward pass fails. When
no row is left the tensors are freed. The copy is sized for the longest *final* context of
the sequences it holds (their reserved pages), so it grows rarely; past ``max_bytes`` the step
falls back to gathering and the copy is dropped.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from cadenza.kernels.kv_quant import dequantize

# Capacities grow in these steps, so that growing (a copy of the whole tensor) stays rare.
ROW_QUANTUM = 8
POSITION_QUANTUM = 256
# Below this many positions (the batch's longest sequence) gathering pages costs no more than
# the copy's own per-step work, and its reads are slower on short rows: measured on the CPU,
# dense/gather step ratios were 0.91-1.0 up to ~300 positions and 1.1-1.4x from 300 to 800
# (docs/journal/2026-12-01-dense-decode-copy.md). Steps below it gather; the copy refills rows
# when contexts pass it.
MIN_CONTEXT = 256


class DenseDecodeKV:
    """The dense copy and which sequence owns which row. One per paged cache (model runner)."""

    def __init__(
        self,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device,
        max_bytes: int,
    ) -> None:
        self.num_layers = num_layers
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.dtype = dtype
        self.device = device
        self.max_bytes = max_bytes
        self.min_context = MIN_CONTEXT
        self.keys: torch.Tensor | None = None  # [layers, rows, Hkv, capacity, D]
        self.values: torch.Tensor | None = None
        self._rows: dict[Hashable, int] = {}
        self._lengths: dict[int, int] = {}  # row -> positions it holds

    @property
    def row_capacity(self) -> int:
        return 0 if self.keys is None else self.keys.shape[1]

    @property
    def position_capacity(self) -> int:
        return 0 if self.keys is None else self.keys.shape[3]

    @property
    def nbytes(self) -> int:
        return 0 if self.keys is None or self.values is None else 2 * self.keys.nbytes

    def bytes_for(self, rows: int, positions: int) -> int:
        itemsize = torch.empty((), dtype=self.dtype).element_size()
        per_position = self.num_layers * self.num_kv_heads * self.head_dim * itemsize
        return 2 * rows * positions * per_position

    def owners(self) -> dict[Hashable, int]:
        """Which owner holds which row (a copy)."""
        return dict(self._rows)

    def retain(self, owners: Iterable[Hashable]) -> None:
        """Release every row whose owner is not among ``owners`` (the running sequences); free
        the tensors when none is left."""
        keep = set(owners)
        self.release([owner for owner in self._rows if owner not in keep])
        if not self._rows:
            self.clear()

    def release(self, owners: Iterable[Hashable]) -> None:
        """Forget the rows of ``owners`` (a later step copies their whole history again)."""
        for owner in owners:
            self._release(owner)

    def clear(self) -> None:
        """Forget every row and free the tensors."""
        self._rows.clear()
        self._lengths.clear()
        self.keys = self.values = None

    def plan(
        self,
        owners: Sequence[Hashable],
        page_tables: np.ndarray,
        seq_lens: np.ndarray,
        final_lens: np.ndarray,
        page_size: int,
        invalidate: Iterable[Hashable] = (),
    ) -> DenseDecodeStep | None:
        """This step's copies and rows for the decoding sequences ``owners`` (batch order;
        hashable, by identity for engine sequences), or ``None``: the caller gathers pages
        instead, when the longest sequence is shorter than ``min_context`` (the copy is left
        as it is) or when the copy would exceed ``max_bytes`` (it is dropped).

        ``page_tables [B, P]`` their pages (-1 padded); ``seq_lens [B]`` the keys each query
        sees (its new token included); ``final_lens [B]`` the most each will ever hold (sizes
        the copy). ``invalidate``: sequences whose keys are being recomputed (they lose
        their rows)."""
        self.release(invalidate)
        if not len(owners) or int(seq_lens.max()) < self.min_context:
            return None
        fresh = []
        for owner in owners:
            if owner not in self._rows:
                row = self._lowest_free_row()
                self._rows[owner], self._lengths[row] = row, 0
                fresh.append(row)
        num_rows = max(self._rows.values(), default=-1) + 1
        positions = int(max(final_lens.max(), seq_lens.max())) if len(owners) else 0
        if not self._fit(num_rows, positions):
            self.clear()
            return None
        assert self.keys is not None and self.values is not None
        for row in fresh:  # a previous owner's keys (NaN included) must not show through
            self.keys[:, row].zero_()
            self.values[:, row].zero_()
        rows = np.array([self._rows[owner] for owner in owners], dtype=np.int64)
        seq_lens = seq_lens.astype(np.int64)
        held = np.array([self._lengths[row] for row in rows], dtype=np.int64)
        # A row that holds every position but the new one takes that one; any other takes the
        # sequence's whole history.
        appends = held == seq_lens - 1
        index = [np.flatnonzero(appends)]
        tokens = [seq_lens[appends] - 1]
        for i in np.flatnonzero(~appends):
            index.append(np.full(seq_lens[i], i))
            tokens.append(np.arange(seq_lens[i]))
        which, token = np.concatenate(index), np.concatenate(tokens)
        slots = page_tables[which, token // page_size].astype(np.int64) * page_size
        slots += token % page_size
        heads = np.arange(self.num_kv_heads, dtype=np.int64)
        sources = slots[:, None] * self.num_kv_heads + heads[None, :]
        dense_rows = rows[which][:, None] * self.num_kv_heads + heads[None, :]
        targets = dense_rows * self.position_capacity + token[:, None]
        for row, length in zip(rows.tolist(), seq_lens.tolist(), strict=True):
            self._lengths[row] = length
        length = int(seq_lens.max()) if len(owners) else 0
        mask = np.arange(length)[None, :] < self._held_lengths(num_rows, rows, seq_lens)
        bias = torch.zeros(mask.shape, dtype=self.dtype)
        bias.masked_fill_(torch.from_numpy(~mask), float("-inf"))
        return DenseDecodeStep(
            keys=self.keys,
            values=self.values,
            sources=torch.from_numpy(sources.reshape(-1)).to(self.device),
            targets=torch.from_numpy(targets.reshape(-1)).to(self.device),
            batch_rows=torch.from_numpy(rows).to(self.device),
            num_rows=num_rows,
            length=length,
            bias=bias[:, None, None, :].to(self.device),
        )

    def _held_lengths(
        self, num_rows: int, batch_rows: np.ndarray, lengths: np.ndarray
    ) -> np.ndarray:
        """``[num_rows, 1]``: each row's visible length this step; a row outside the batch
        sees its first position only (a fully masked row would make NaN)."""
        held = np.ones((num_rows, 1), dtype=np.int64)
        held[batch_rows, 0] = lengths
        return held

    def _lowest_free_row(self) -> int:
        used = set(self._rows.values())
        return next(row for row in range(len(used) + 1) if row not in used)

    def _release(self, owner: Hashable) -> None:
        row = self._rows.pop(owner, None)
        if row is not None:
            self._lengths.pop(row, None)

    def _fit(self, rows: int, positions: int) -> bool:
        """Grow the tensors to hold ``rows`` rows of ``positions`` positions (keeping what
        they hold); ``False`` if that would pass ``max_bytes``."""
        if rows <= self.row_capacity and positions <= self.position_capacity:
            return True
        new_positions = max(self.position_capacity, _round_up(positions, POSITION_QUANTUM))
        new_rows = max(self.row_capacity, _round_up(rows, ROW_QUANTUM))
        if rows > self.row_capacity:  # double when growing, unless that passes the limit
            doubled = _round_up(max(rows, 2 * self.row_capacity), ROW_QUANTUM)
            if self.bytes_for(doubled, new_positions) <= self.max_bytes:
                new_rows = doubled
        if self.bytes_for(new_rows, new_positions) > self.max_bytes:
            return False
        shape = (self.num_layers, new_rows, self.num_kv_heads, new_positions, self.head_dim)
        # Zeros, not empty: masked positions are still multiplied (0 x NaN would be NaN).
        keys = torch.zeros(shape, dtype=self.dtype, device=self.device)
        values = torch.zeros(shape, dtype=self.dtype, device=self.device)
        if self.keys is not None and self.values is not None:
            rows_held, positions_held = self.row_capacity, self.position_capacity
            keys[:, :rows_held, :, :positions_held] = self.keys
            values[:, :rows_held, :, :positions_held] = self.values
        self.keys, self.values = keys, values
        return True


@dataclass(frozen=True)
class DenseDecodeStep:
    """One step's plan, the same for every layer: copy ``sources`` (rows of a layer's cache
    seen as ``[slots * Hkv, D]``) to ``targets`` (rows of its dense tensor seen as ``[rows *
    Hkv * capacity, D]``), then attend each query of the batch from its row."""

    keys: torch.Tensor
    values: torch.Tensor
    sources: torch.Tensor  # [M] int64
    targets: torch.Tensor  # [M] int64
    batch_rows: torch.Tensor  # [B] int64: the row of each decode query
    num_rows: int  # attention runs over rows [0, num_rows)
    length: int  # and positions [0, length)
    bias: torch.Tensor  # [num_rows, 1, 1, length]: 0 where visible, -inf elsewhere

    def attend(
        self,
        layer: int,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        scale: float,
        k_scale: torch.Tensor | None = None,
        v_scale: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``q [B, Hq, D]`` against layer ``layer``'s rows, after copying in what changed from
        its cache (stored for this step already). Returns ``[B, Hq, D]``."""
        batch, num_q_heads, head_dim = q.shape
        num_kv_heads = self.keys.shape[2]
        dense_keys, dense_values = self.keys[layer], self.values[layer]
        if self.sources.numel():
            for cache, dense, cache_scale in (
                (k_cache, dense_keys, k_scale),
                (v_cache, dense_values, v_scale),
            ):
                fresh = cache.view(-1, head_dim).index_select(0, self.sources)
                if cache.dtype == torch.int8:
                    assert cache_scale is not None
                    fresh = dequantize(fresh, cache_scale.reshape(-1)[self.sources], q.dtype)
                dense.view(-1, head_dim).index_copy_(0, self.targets, fresh.to(dense.dtype))
        group = num_q_heads // num_kv_heads
        grouped = q.reshape(batch, num_kv_heads, group, head_dim)
        queries = grouped.new_zeros(self.num_rows, num_kv_heads, group, head_dim)
        queries.index_copy_(0, self.batch_rows, grouped)
        out = F.scaled_dot_product_attention(
            queries,
            dense_keys[: self.num_rows, :, : self.length].to(q.dtype),
            dense_values[: self.num_rows, :, : self.length].to(q.dtype),
            attn_mask=self.bias.to(q.dtype),
            scale=scale,
        )
        return out.index_select(0, self.batch_rows).reshape(batch, num_q_heads, head_dim)


def _round_up(value: int, quantum: int) -> int:
    return -(-value // quantum) * quantum
