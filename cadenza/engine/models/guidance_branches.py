"""Both branches of classifier-free guidance through the paged self-attention, in one step.

A guided model runs each stream twice, conditioned and unconditioned, as one batch of ``2N``
rows: the step's ``N`` tokens, then the same tokens again. The unconditional branch keeps its
keys and values in the same pages at the same slots, in layers ``L .. 2L-1`` of the cache (the
model's KV spec has ``2L`` layers, so admission and the page pool price both branches).
"""

from __future__ import annotations

import torch

from cadenza.engine.kv.paged_kv_cache import PagedKVCache
from cadenza.kernels.attention_backends import AttentionBackend
from cadenza.kernels.attention_context import AttentionContext


def attend_both_branches(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    kv_cache: PagedKVCache,
    context: AttentionContext,
    backend: AttentionBackend,
    scale: float,
    layer: int,
    num_layers: int,
) -> torch.Tensor:
    """``q [2N, Hq, D]``, ``k, v [2N, Hkv, D]`` (the conditional rows, then the unconditional
    ones) of decoder layer ``layer`` of ``num_layers`` -> ``[2N, Hq, D]``: each branch attends
    to its own cache layer (``layer``, ``num_layers + layer``), stores its keys and values
    there, through the step's ``context``."""
    n = q.shape[0] // 2
    branches = []
    for branch, cache_layer in enumerate((layer, num_layers + layer)):
        rows = slice(branch * n, (branch + 1) * n)
        k_cache, v_cache = kv_cache.layer(cache_layer)
        k_scale, v_scale = kv_cache.layer_scales(cache_layer)
        branches.append(
            backend.forward(
                q[rows], k[rows], v[rows], k_cache, v_cache, context, scale, k_scale, v_scale,
                cache_layer,
            )
        )  # fmt: skip
    return torch.cat(branches)
