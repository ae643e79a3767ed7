"""Everything the attention layers need to know about one step's flattened batch.

The batch is ``N`` tokens: first one token for each of ``num_decodes`` decoding sequences, then
the chunks of the prefilling sequences, back to back::

    tokens   [ d0 d1 d2 | p0 p0 p0 p0 | p1 p1 ]
              decodes     prefill 0     prefill 1

The model runner builds one context per step; every layer reads it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


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
    # Derived once per step for backends that gather pages (the same for every layer):
    # the cache slot of every key position each decode sees, padded to the longest, and
    # which of those positions are real.
    decode_key_slots: torch.Tensor | None = None  # [num_decodes, L] int64
    decode_key_mask: torch.Tensor | None = None  # [num_decodes, L] bool


def decode_key_slots(
    page_tables: torch.Tensor, seq_lens: torch.Tensor, page_size: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """For each decoding sequence, the cache slot of each of its key positions (padded to the
    longest sequence with slot 0) and the mask of real positions: ``[B, L]`` each."""
    max_len = int(seq_lens.max()) if seq_lens.numel() else 0
    positions = torch.arange(max_len, device=page_tables.device)
    pages = page_tables[:, positions // page_size].long().clamp(min=0)
    slots = pages * page_size + positions % page_size
    mask = positions[None, :] < seq_lens[:, None]
    return slots.masked_fill(~mask, 0), mask
