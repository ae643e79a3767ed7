"""Cross-attention of a step's decoder tokens to each stream's own encoder output.

An encoder-decoder model keeps, per stream, the keys and values its decoder layers read from
the encoder's output (:class:`CrossKV`, computed once when the stream starts, part of its
:class:`~cadenza.engine.models.stream_state.StreamState`). A step's tokens are flattened
(:class:`~cadenza.engine.models.stream_state.StepStreams`: each stream's tokens in order, one
for a decode, a chunk for a prefill); :func:`attend_streams` lets each stream's tokens attend
to its own keys only, one stream at a time over its keys where they lie (no copy, no padding:
a stream's attention is exactly what it would be alone).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.nn import functional


@dataclass(frozen=True)
class CrossKV:
    """One layer's keys and values for one stream: ``keys, values [Hkv, T, D]`` over the
    stream's ``T`` encoder positions (all of them attended: the encoder saw no padding)."""

    keys: torch.Tensor
    values: torch.Tensor

    @property
    def nbytes(self) -> int:
        return self.keys.nbytes + self.values.nbytes


def attend_streams(
    q: torch.Tensor,
    kv: list[CrossKV],
    token_counts: tuple[int, ...],
    scale: float,
) -> torch.Tensor:
    """``q [N, Hq, D]``: the step's tokens, ``token_counts[j]`` of them (consecutive) for
    stream ``j``, which attend to ``kv[j]`` -> ``[N, Hq, D]``. ``Hq`` is a multiple of the
    keys' ``Hkv`` (grouped-query attention)."""
    out = torch.empty_like(q)
    start = 0
    for index, count in enumerate(token_counts):
        if count:
            item = kv[index]
            out[start : start + count] = functional.scaled_dot_product_attention(
                q[start : start + count].transpose(0, 1),
                item.keys,
                item.values,
                scale=scale,
                enable_gqa=item.keys.shape[0] != q.shape[1],
            ).transpose(0, 1)
        start += count
    return out
