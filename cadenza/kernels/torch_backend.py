"""The attention backend on CPU (and the reference elsewhere): torch ops over paged KV.

A backend takes one layer's new ``q, k, v`` for a step's flattened batch, stores ``k, v`` in the
paged cache and returns the attention output for every token. Decode tokens go through one
batched call; each prefill chunk gets its own call (prefills are few and long, decodes many).
"""

from __future__ import annotations

import torch

from cadenza.kernels.attention_context import AttentionContext
from cadenza.kernels.paged_attention import (
    paged_decode_attention,
    paged_prefill_attention,
    store_kv,
)


class TorchAttentionBackend:
    name = "torch"

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        context: AttentionContext,
        scale: float,
    ) -> torch.Tensor:
        """``q [N, Hq, D]``, ``k, v [N, Hkv, D]`` -> ``[N, Hq, D]``."""
        store_kv(k, v, k_cache, v_cache, context.slot_mapping)
        pieces = []
        if context.num_decodes:
            pieces.append(
                paged_decode_attention(
                    q[: context.num_decodes],
                    k_cache,
                    v_cache,
                    context.decode_block_tables,
                    context.decode_seq_lens,
                    scale,
                    key_slots=None
                    if context.decode_key_slots is None or context.decode_key_mask is None
                    else (context.decode_key_slots, context.decode_key_mask),
                )
            )
        for span in context.prefills:
            chunk = q[span.query_start : span.query_start + span.query_len]
            pieces.append(
                paged_prefill_attention(
                    chunk, k_cache, v_cache, span.block_table, span.context_len, scale
                )
            )
        return pieces[0] if len(pieces) == 1 else torch.cat(pieces)
