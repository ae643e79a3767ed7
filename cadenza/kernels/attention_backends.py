"""Attention backends: torch ops over paged KV (CPU, and the reference), Triton decode on CUDA.

A backend takes one layer's new ``q, k, v`` for a step's flattened batch, stores ``k, v`` in the
paged cache and returns the attention output for every token. Decode tokens go through one
batched call; each prefill chunk gets its own call (prefills are few and long, decodes many).
"""

from __future__ import annotations

import torch

from cadenza.kernels.attention_context import AttentionContext
from cadenza.kernels.decode_attention import triton_installed
from cadenza.kernels.torch_attention import (
    store_kv,
    torch_paged_decode_attention,
    torch_paged_prefill_attention,
)


class TorchAttentionBackend:
    name = "torch"

    def decode(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        context: AttentionContext,
        scale: float,
        k_scale: torch.Tensor | None,
        v_scale: torch.Tensor | None,
    ) -> torch.Tensor:
        """The decode tokens' attention (one per sequence), over gathered pages with SDPA."""
        return torch_paged_decode_attention(
            q,
            k_cache,
            v_cache,
            context.decode_page_tables,
            context.decode_seq_lens,
            scale,
            keys=context.decode_keys,
            k_scale=k_scale,
            v_scale=v_scale,
        )

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        context: AttentionContext,
        scale: float,
        k_scale: torch.Tensor | None = None,
        v_scale: torch.Tensor | None = None,
        layer_index: int = 0,
    ) -> torch.Tensor:
        """``q [N, Hq, D]``, ``k, v [N, Hkv, D]`` -> ``[N, Hq, D]``. ``k_scale, v_scale``: the
        layer's scales when the cache is int8. ``layer_index``: which layer's dense decode
        copy to use when the context carries one (:mod:`cadenza.kernels.dense_decode_kv`)."""
        store_kv(
            k,
            v,
            k_cache,
            v_cache,
            context.slot_mapping,
            k_scale,
            v_scale,
            every_slot_set=context.stores_every_token,
        )
        pieces = []
        if context.num_decodes:
            decode_q = q[: context.num_decodes]
            if context.dense_decode is not None:
                pieces.append(
                    context.dense_decode.attend(
                        layer_index, decode_q, k_cache, v_cache, scale, k_scale, v_scale
                    )
                )
            else:
                pieces.append(
                    self.decode(decode_q, k_cache, v_cache, context, scale, k_scale, v_scale)
                )
        for span in context.prefills:
            chunk = q[span.query_start : span.query_start + span.query_len]
            pieces.append(
                torch_paged_prefill_attention(
                    chunk,
                    k_cache,
                    v_cache,
                    span.page_table,
                    span.context_len,
                    scale,
                    k_scale,
                    v_scale,
                )
            )
        return pieces[0] if len(pieces) == 1 else torch.cat(pieces)


class TritonAttentionBackend(TorchAttentionBackend):
    """On CUDA: decode tokens through the Triton paged kernel (GQA packing, split-K); prefill
    chunks through SDPA over gathered pages, as on the CPU (prefills are few, long and
    compute-bound, where SDPA's fused kernels do well)."""

    name = "triton"

    def decode(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        context: AttentionContext,
        scale: float,
        k_scale: torch.Tensor | None,
        v_scale: torch.Tensor | None,
    ) -> torch.Tensor:
        from cadenza.kernels.triton_decode_attention import triton_paged_decode_attention

        return triton_paged_decode_attention(
            q,
            k_cache,
            v_cache,
            context.decode_page_tables,
            context.decode_seq_lens,
            scale,
            k_scale,
            v_scale,
        )


def attention_backend_for(device: torch.device) -> TorchAttentionBackend:
    """Triton on CUDA when it is installed; the torch backend everywhere else (on the CPU
    even under ``TRITON_INTERPRET=1``: the interpreter checks kernels, it does not serve)."""
    if device.type == "cuda" and triton_installed():
        return TritonAttentionBackend()
    return TorchAttentionBackend()
