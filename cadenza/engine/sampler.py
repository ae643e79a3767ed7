"""Token sampling with per-codebook constraints: greedy, temperature, top-k, top-p."""

from __future__ import annotations

import torch

from cadenza.engine.sampling_params import SamplingParams


def sample_row(
    logits: torch.Tensor,
    allowed: torch.Tensor,
    forced: list[int | None],
    params: SamplingParams,
    generator: torch.Generator,
) -> list[int]:
    """Draw one id per codebook.

    ``logits``: ``[K, V]``. ``allowed``: bool ``[K, V]``, the ids each codebook may emit when
    free. ``forced``: per codebook an id to emit regardless of the logits, or ``None``.
    """
    masked = logits.float().masked_fill(~allowed, float("-inf"))
    if params.greedy:
        chosen = masked.argmax(dim=-1)
    else:
        masked = masked / params.temperature
        if params.top_k:
            k = min(params.top_k, masked.shape[-1])
            kth = torch.topk(masked, k, dim=-1).values[:, -1:]
            masked = masked.masked_fill(masked < kth, float("-inf"))
        if params.top_p < 1:
            masked = _top_p_filter(masked, params.top_p)
        probs = torch.softmax(masked, dim=-1)
        chosen = torch.multinomial(probs, 1, generator=generator).squeeze(-1)
    ids = chosen.tolist()
    return [f if f is not None else i for f, i in zip(forced, ids, strict=True)]


def _top_p_filter(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
    cumulative = torch.softmax(sorted_logits, dim=-1).cumsum(dim=-1)
    # Drop a token when the mass before it already reaches top_p; the first token always stays.
    drop_sorted = (cumulative - torch.softmax(sorted_logits, dim=-1)) >= top_p
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
    return logits.masked_fill(drop, float("-inf"))
