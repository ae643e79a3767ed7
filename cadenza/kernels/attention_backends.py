"""Attention backends: paged attention in torch (CPU, and the reference) or with the Triton
decode kernel (CUDA), behind one :class:`AttentionBackend` protocol, and the one rule that
picks a backend for a device (:func:`attention_backend_for`).

A backend answers three questions over one layer's paged KV cache: the attention of decode
tokens (one query per sequence, all in one batched call), of one prefill chunk (causal over
its sequence's pages), and of a whole step (:meth:`AttentionBackend.forward`: store the step's
new keys and values, then decode tokens, then each prefill chunk; prefills are few and long,
decodes many)::

    tokens   [ d0 d1 d2 | p0 p0 p0 p0 | p1 p1 ]
              decode()    prefill()     prefill()

    backend   decode                                 prefill
    torch     gather + SDPA (torch_attention)        gather + causal SDPA
    triton    the Triton paged kernel (split-K)      as torch

Triton is imported only when a Triton backend first decodes. The public
:func:`~cadenza.kernels.decode_attention.paged_decode_attention` goes through the same backends.
"""

from __future__ import annotations

from typing import Protocol

import torch

from cadenza.kernels.attention_context import AttentionContext, DecodeKeys
from cadenza.kernels.torch_attention import (
    store_kv,
    torch_paged_decode_attention,
    torch_paged_prefill_attention,
)
from cadenza.kernels.triton_support import triton_can_run, triton_installed

TRITON_DTYPES = (torch.float16, torch.float32, torch.bfloat16)
"""Query dtypes the Triton decode kernel takes; any other goes to torch."""


class AttentionBackend(Protocol):
    """Paged attention over one layer's cache ``k_cache, v_cache [num_pages, page_size, Hkv,
    D]`` (fp32, fp16, bf16 or int8; with int8, ``k_scale, v_scale [num_pages, page_size,
    Hkv]``). ``Hq`` is a multiple of ``Hkv``; every output is in ``q``'s dtype."""

    name: str

    def decode(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        page_tables: torch.Tensor,
        seq_lens: torch.Tensor,
        scale: float,
        k_scale: torch.Tensor | None = None,
        v_scale: torch.Tensor | None = None,
        keys: DecodeKeys | None = None,
    ) -> torch.Tensor:
        """One query token per sequence against its pages: ``q [B, Hq, D]``,
        ``page_tables [B, max_pages]`` int32 (-1 padded), ``seq_lens [B]`` int32 (keys each
        query sees, its own included, at least 1) -> ``[B, Hq, D]``. ``keys``: the step's
        :class:`DecodeKeys` when the caller has them (a gathering backend reuses them)."""
        ...

    def prefill(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        page_table: torch.Tensor,
        context_len: int,
        scale: float,
        k_scale: torch.Tensor | None = None,
        v_scale: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``T`` new queries of one sequence ``q [T, Hq, D]``, causally, over its first
        ``context_len`` cached tokens (the ``T`` new ones are the last of them) ->
        ``[T, Hq, D]``."""
        ...

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
        """One layer of a step's flattened batch: store ``k, v [N, Hkv, D]`` at
        ``context.slot_mapping``, then ``q [N, Hq, D]`` -> ``[N, Hq, D]`` (decode tokens
        first, then each prefill chunk). ``layer_index``: which layer's dense decode copy to
        use when the context carries one (:mod:`cadenza.kernels.dense_decode_kv`)."""
        ...


class TorchAttentionBackend:
    """Torch ops over gathered pages: the reference, and the CPU's serving path."""

    name = "torch"

    def decode(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        page_tables: torch.Tensor,
        seq_lens: torch.Tensor,
        scale: float,
        k_scale: torch.Tensor | None = None,
        v_scale: torch.Tensor | None = None,
        keys: DecodeKeys | None = None,
    ) -> torch.Tensor:
        """Every decode query over its gathered pages with SDPA, one call for the batch."""
        return torch_paged_decode_attention(
            q,
            k_cache,
            v_cache,
            page_tables,
            seq_lens,
            scale,
            keys=keys,
            k_scale=k_scale,
            v_scale=v_scale,
        )

    def prefill(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        page_table: torch.Tensor,
        context_len: int,
        scale: float,
        k_scale: torch.Tensor | None = None,
        v_scale: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The chunk over its sequence's gathered pages with causal SDPA."""
        return torch_paged_prefill_attention(
            q, k_cache, v_cache, page_table, context_len, scale, k_scale, v_scale
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
        """See :meth:`AttentionBackend.forward`. Decode tokens read the CPU's dense copy of
        their keys when the context carries one, else :meth:`decode`."""
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
                    self.decode(
                        decode_q,
                        k_cache,
                        v_cache,
                        context.decode_page_tables,
                        context.decode_seq_lens,
                        scale,
                        k_scale,
                        v_scale,
                        keys=context.decode_keys,
                    )
                )
        for span in context.prefills:
            chunk = q[span.query_start : span.query_start + span.query_len]
            pieces.append(
                self.prefill(
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
    """Decode tokens through the Triton paged kernel (GQA packing, split-K); prefill chunks
    and the step as the torch backend does them (prefills are few, long and compute-bound,
    where SDPA's fused kernels do well)."""

    name = "triton"

    def decode(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        page_tables: torch.Tensor,
        seq_lens: torch.Tensor,
        scale: float,
        k_scale: torch.Tensor | None = None,
        v_scale: torch.Tensor | None = None,
        keys: DecodeKeys | None = None,
    ) -> torch.Tensor:
        """The Triton kernel (it reads the page tables itself: ``keys`` is not needed)."""
        from cadenza.kernels.triton_decode_attention import triton_paged_decode_attention

        return triton_paged_decode_attention(
            q, k_cache, v_cache, page_tables, seq_lens, scale, k_scale, v_scale
        )


def attention_backend_for(
    device: torch.device, dtype: torch.dtype | None = None, *, interpreter: bool = False
) -> AttentionBackend:
    """The backend for queries of ``dtype`` (any the model serves in, when ``None``) on
    ``device``: Triton where its kernels run compiled (CUDA, with Triton installed), torch
    everywhere else and for a dtype the Triton kernel does not take. With ``interpreter``,
    Triton's CPU interpreter counts too (under ``TRITON_INTERPRET=1``): that checks the
    kernels, it does not serve, so the model layers never ask for it."""
    if dtype is not None and dtype not in TRITON_DTYPES:
        return TorchAttentionBackend()
    compiled = device.type == "cuda" and triton_installed()
    if compiled or (interpreter and triton_can_run(device)):
        return TritonAttentionBackend()
    return TorchAttentionBackend()
