"""Everything the attention layers need to know about one step's flattened batch.

The batch is ``N`` tokens: first one token for each of ``num_decodes`` decoding sequences, then
the chunks of the prefilling sequences, back to back::

    tokens   [ d0 d1 d2 | p0 p0 p0 p0 | p1 p1 ]
              decodes     prefill 0     prefill 1

The model runner builds one context per step; every layer reads it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from cadenza.kernels.dense_decode_kv import DenseDecodeStep


@dataclass(frozen=True)
class PrefillSpan:
    """One prefilling sequence: its tokens are ``[query_start, query_start + query_len)`` of the
    batch; after this step it has ``context_len`` tokens cached (the new ones included)."""

    query_start: int
    query_len: int
    context_len: int
    page_table: torch.Tensor  # [num_pages] int32


@dataclass(frozen=True)
class AttentionContext:
    slot_mapping: torch.Tensor  # [N] int64: cache slot of each token (-1: do not store)
    num_decodes: int
    decode_page_tables: torch.Tensor  # [num_decodes, max_pages] int32, -1 padded
    decode_seq_lens: torch.Tensor  # [num_decodes] int32, tokens cached after this step
    prefills: tuple[PrefillSpan, ...]
    # Derived once per step for backends that gather pages (the same for every layer).
    decode_keys: DecodeKeys | None = None
    # The CPU's dense copy of the decoding keys (instead of gathering pages), when in use.
    dense_decode: DenseDecodeStep | None = None
    # Whether every token has a cache slot, when whoever built the context knows it from the
    # slots it wrote on the host (None: read from ``slot_mapping``, a device read on a GPU).
    every_slot_set: bool | None = None

    @property
    def stores_every_token(self) -> bool:
        """Whether every token has a cache slot (no ``-1`` in ``slot_mapping``): the builder's
        :attr:`every_slot_set`, else read from the slots (each time: a plain property, which
        ``torch.compile`` traces, where a cached one's lock stops it)."""
        if self.every_slot_set is not None:
            return self.every_slot_set
        return not self.slot_mapping.numel() or bool((self.slot_mapping >= 0).all())


@dataclass(frozen=True)
class DecodeKeys:
    """Where every decode query's keys are, padded to the longest sequence ``L``, in the
    layout the gathering attention wants: one key head's positions contiguous.

    ``rows [B, Hkv, L]`` int64: the row of ``cache.view(-1, head_dim)`` (a layer's cache seen
    as one row per slot and head) holding key position ``l`` of head ``h`` for query ``b``;
    padding points at row 0. ``bias [B, 1, 1, L]`` float32: 0 at real positions, ``-inf`` at
    padding (the additive mask for SDPA). ``slots``, ``mask [B, L]``: the same per slot."""

    slots: torch.Tensor
    mask: torch.Tensor
    rows: torch.Tensor
    bias: torch.Tensor


def decode_keys(
    page_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    page_size: int,
    num_kv_heads: int,
    max_len: int | None = None,
) -> DecodeKeys:
    """:class:`DecodeKeys` of decoding sequences with ``page_tables [B, max_pages]`` (-1
    padded) and ``seq_lens [B]`` (keys each query sees); ``max_len``: the longest of
    ``seq_lens`` where the caller knows it on the host (else read from the tensor)."""
    slots, mask = decode_key_slots(page_tables, seq_lens, page_size, max_len)
    heads = torch.arange(num_kv_heads, device=slots.device)
    rows = slots[:, None, :] * num_kv_heads + heads[None, :, None]
    bias = torch.zeros(mask.shape, device=mask.device).masked_fill_(~mask, float("-inf"))
    return DecodeKeys(slots=slots, mask=mask, rows=rows, bias=bias[:, None, None, :])


def decode_key_slots(
    page_tables: torch.Tensor, seq_lens: torch.Tensor, page_size: int, max_len: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """For each decoding sequence, the cache slot of each of its key positions (padded to the
    longest sequence, ``max_len`` where given, with slot 0) and the mask of real positions:
    ``[B, L]`` each."""
    if max_len is None:
        max_len = int(seq_lens.max()) if seq_lens.numel() else 0
    positions = torch.arange(max_len, device=page_tables.device)
    pages = page_tables[:, positions // page_size].long().clamp(min=0)
    slots = pages * page_size + positions % page_size
    mask = positions[None, :] < seq_lens[:, None]
    return slots.masked_fill(~mask, 0), mask
