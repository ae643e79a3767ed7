"""Batched sampling of one row per sequence: repetition penalty, masks, greedy or
temperature / top-k / top-p, forced ids.

Every sequence's random numbers come from its own generator, so a seeded request samples the
same ids whatever else shares its batch. Two ways to draw, chosen per sequence by its own
settings (never by the batch):

- without top-p, the candidates are the ids at least as likely as the k-th best (and, with
  ``min_p``, as the floor it sets): one threshold per row, found by a partial partition, no
  ranking. One uniform per codebook picks an id by inverse CDF over the candidates in id
  order. This is the serving default: on a CPU the whole draw costs about half of what the
  ranked draw below does (``topk`` alone is ~1.5 ms over a 16-stream cadenza-tiny batch;
  docs/journal/2026-12-01-sampling-by-threshold-codecs-time-major.md), and where a C++
  compiler is found it is one native call (:mod:`cadenza.kernels.cpu_sampling`, the same
  arithmetic per row).
- with top-p, the nucleus needs the candidates' mass in rank order: top-k (or a sort), then
  the exponential race (``argmax(p / E)`` with ``E ~ Exp(1)``, equivalent to drawing from
  ``p``), one uniform per candidate, the i-th to the i-th best id.

Everything else is one batched tensor operation over ``[S, K, V]``.
"""

from __future__ import annotations

import numpy as np
import torch

from cadenza.engine.sequence import Sequence
from cadenza.kernels import cpu_sampling

# A shared mask banning at most one id in this many is applied by filling those ids alone.
_FEW_BANNED = 4


def sample_rows(
    logits: torch.Tensor,
    seqs: list[Sequence],
    masks: torch.Tensor | None,
    constraints: list[tuple[int, list[int | None] | None]],
    codebook: int = 0,
    columns: torch.Tensor | None = None,
) -> list[list[int]]:
    """``logits [S, K, V]`` -> one row of ``K`` ids per sequence.

    ``masks [M, K, V]`` bool (``None``: no restriction) with ``constraints[i] = (mask index,
    forced ids or None)`` for sequence ``i``. Forced ids replace the sampled ones. When the
    masks leave at most half the vocabulary, everything works on the allowed ids only (same
    result: an excluded id can never be drawn). ``codebook``: the row's first codebook, for
    a part of a row (a depth decoder samples a row one codebook at a time); the repetition
    penalty then looks at the ids seen in those codebooks. ``columns``: the ids ``logits``
    are over when a restricted head computed only those
    (:class:`~cadenza.engine.models.restricted_heads.RestrictedHeads`; ``masks`` required),
    whose logits are already ``-inf`` outside each row's mask: the mask is not applied again
    (finding the ids it bans would be a read of the device's copy every step).
    """
    logits = logits.float()
    num_seqs, _, vocab = logits.shape
    device = logits.device
    allowed: torch.Tensor | None = None
    if columns is not None:  # logits already over a restricted head's columns, masked by it
        assert masks is not None, "restricted logits need the masks they were cut by"
        vocab = masks.shape[-1]
        columns = columns.to(device)
    elif masks is not None:
        allowed = _allowed(masks, constraints, device)
        used = allowed.any(dim=1).any(dim=0).nonzero().squeeze(1)
        if used.numel() <= vocab // 2:  # e.g. one frame position's codes out of a text vocab
            columns = used
            logits = logits.index_select(-1, columns)
            allowed = allowed.index_select(-1, columns)
    penalized = [i for i, s in enumerate(seqs) if s.sampling.repetition_penalty != 1.0]
    if penalized:
        width = logits.shape[1]
        seen = torch.stack(
            [seqs[i].seen_mask(vocab)[codebook : codebook + width] for i in penalized]
        ).to(device)
        if columns is not None:
            seen = seen.index_select(-1, columns)
        penalty = torch.tensor(
            [seqs[i].sampling.repetition_penalty for i in penalized], device=device
        ).view(-1, 1, 1)
        sub = logits[penalized]
        scaled = torch.where(sub > 0, sub / penalty, sub * penalty)
        logits[penalized] = torch.where(seen, scaled, sub)
    if allowed is not None:
        logits = _exclude(logits, allowed)

    random = [i for i, s in enumerate(seqs) if not s.sampling.greedy]
    if len(random) == num_seqs:  # the usual serving batch: no argmax to throw away
        chosen = _draw(seqs, logits)
    else:
        chosen = logits.argmax(dim=-1)
        if random:
            chosen[random] = _draw([seqs[i] for i in random], logits[random])
    if columns is not None:
        chosen = columns[chosen]

    rows: list[list[int]] = chosen.tolist()
    for row, (_, forced) in zip(rows, constraints, strict=True):
        if forced is not None:
            for k, token in enumerate(forced):
                if token is not None:
                    row[k] = token
    assert len(rows) == num_seqs
    return rows


def _allowed(
    masks: torch.Tensor,
    constraints: list[tuple[int, list[int | None] | None]],
    device: torch.device,
) -> torch.Tensor:
    """Each sequence's mask ``[1 or S, K, V]``: one broadcast mask when the whole batch is at
    the same one (the usual batch), not copied."""
    which = [c[0] for c in constraints]
    if len(set(which)) == 1:
        return masks[which[0] : which[0] + 1].to(device)
    return masks[torch.tensor(which, device=masks.device)].to(device)


def _exclude(logits: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    """``logits [S, K, V]`` with ``-inf`` wherever ``allowed [1 or S, K, V]`` is False, as a
    new tensor. One mask for several rows that bans few ids (a layout's special tokens) is
    filled at those ids only: ``masked_fill`` broadcasting the mask over every row took
    150 us for ten cadenza-tiny rows on the CPU, finding and filling the banned ids 12 (for
    one row, ``masked_fill`` is the cheaper)."""
    if allowed.shape[0] == 1 and logits.shape[0] > 1:
        banned = (~allowed[0]).flatten().nonzero().squeeze(1)
        if _FEW_BANNED * banned.numel() <= allowed[0].numel():
            out = logits.clone(memory_format=torch.contiguous_format)
            out.view(out.shape[0], -1).index_fill_(1, banned, float("-inf"))
            return out
    return logits.masked_fill(~allowed, float("-inf"))


def _draw(seqs: list[Sequence], logits: torch.Tensor) -> torch.Tensor:
    """Sample one id per codebook for each sequence from its top-k / top-p / min-p candidates,
    each sequence the way its own settings call for (see the module docstring)."""
    ranked = [i for i, s in enumerate(seqs) if _ranks_candidates(s)]
    if not ranked:
        return _draw_thresholded(seqs, logits)
    if len(ranked) == len(seqs):
        return _draw_ranked(seqs, logits)
    rest = [i for i, s in enumerate(seqs) if not _ranks_candidates(s)]
    chosen = torch.empty(logits.shape[:2], dtype=torch.long, device=logits.device)
    chosen[ranked] = _draw_ranked([seqs[i] for i in ranked], logits[ranked])
    chosen[rest] = _draw_thresholded([seqs[i] for i in rest], logits[rest])
    return chosen


def _ranks_candidates(seq: Sequence) -> bool:
    """Whether ``seq`` draws by rank (top-p needs its candidates' mass in rank order)."""
    return seq.sampling.top_p < 1.0


def _draw_thresholded(seqs: list[Sequence], logits: torch.Tensor) -> torch.Tensor:
    """One id per codebook for each sequence, among the ids at least as likely as its k-th
    best (and its ``min_p`` floor), by inverse CDF in id order: one uniform per codebook from
    the sequence's generator. Ties at the k-th value are all candidates."""
    device = logits.device
    num_seqs, num_codebooks, vocab = logits.shape
    top_k = [min(s.sampling.top_k or vocab, vocab) for s in seqs]
    uniform = torch.empty(num_seqs, num_codebooks, 1, device=device)
    for index, seq in enumerate(seqs):
        uniform[index].uniform_(generator=seq.generator)
    if device.type == "cpu" and cpu_sampling.available():
        return cpu_sampling.draw_thresholded(
            logits,
            [s.sampling.temperature for s in seqs],
            top_k,
            [s.sampling.min_p for s in seqs],
            uniform[..., 0],
        )
    temperature = torch.tensor([s.sampling.temperature for s in seqs], device=device)
    logits = logits / temperature.view(-1, 1, 1)
    threshold = _kth_largest(logits, top_k)
    best = logits.amax(dim=-1, keepdim=True)
    min_p = torch.tensor([s.sampling.min_p for s in seqs], device=device).view(-1, 1, 1)
    if any(s.sampling.min_p > 0 for s in seqs):  # relative to the best id: order-free filters
        threshold = torch.maximum(threshold, best + min_p.log())
    # A masked id (-inf) is never a candidate, even when fewer than k ids are allowed.
    threshold = threshold.clamp(min=torch.finfo(logits.dtype).min)
    # 1 where logits >= threshold, else 0, in float ops (a broadcast comparison that makes a
    # bool tensor is several times slower on a CPU).
    keep = (logits - threshold).sign_().add_(1.0).clamp_(max=1.0)
    weights = (logits - best).exp_().mul_(keep)
    cdf = weights.cumsum_(dim=-1)
    total = cdf[..., -1:]
    # Below the total, so the first cdf entry above the target is a candidate's (a non-zero
    # weight), even when u * total rounds up.
    target = torch.minimum(uniform * total, torch.nextafter(total, torch.zeros_like(total)))
    return torch.searchsorted(cdf, target, right=True)[..., 0]


def _kth_largest(logits: torch.Tensor, top_k: list[int]) -> torch.Tensor:
    """``[S, K, 1]``: the ``top_k[s]``-th largest value of every row of sequence ``s``."""
    num_seqs, num_codebooks, vocab = logits.shape
    if logits.device.type == "cpu":
        # A partition puts the k-th value in place without ordering the rest (numpy's
        # introselect; torch's kthvalue and topk are several times slower on a CPU).
        where = [vocab - k for k in top_k]
        values = torch.from_numpy(np.partition(logits.numpy(), sorted(set(where)), axis=-1))
    else:  # an accelerator's top-k is fast; a copy to the host would not be
        where = [k - 1 for k in top_k]
        values = logits.topk(max(top_k), dim=-1).values
    index = torch.tensor(where, device=logits.device).view(-1, 1, 1)
    return values.gather(-1, index.expand(num_seqs, num_codebooks, 1))


def _draw_ranked(seqs: list[Sequence], logits: torch.Tensor) -> torch.Tensor:
    """One id per codebook for each sequence from its top-k / top-p / min-p candidates in rank
    order, by the exponential race with one uniform per candidate."""
    device = logits.device
    num_seqs, num_codebooks, vocab = logits.shape
    temperature = torch.tensor([s.sampling.temperature for s in seqs], device=device)
    logits = logits / temperature.view(-1, 1, 1)
    top_k = [min(s.sampling.top_k or vocab, vocab) for s in seqs]
    top_p = [s.sampling.top_p for s in seqs]
    min_p = [s.sampling.min_p for s in seqs]
    # Ids a mask excluded (-inf) are never candidates: no need to rank past a sequence's
    # allowed ones (counted per sequence, so its draws still do not depend on the batch).
    allowed = torch.isfinite(logits).sum(dim=-1).amax(dim=-1).clamp(min=1).tolist()
    top_k = [min(k, n) for k, n in zip(top_k, allowed, strict=True)]
    width = max(top_k)
    # Candidates, best first: top-k needs only the best ``width`` ids, not a full sort. The
    # order is also what makes a sequence's draw independent of the batch: its i-th uniform
    # always goes to its i-th best id, whatever ``width`` the batch needed.
    if width < vocab:
        values, order = logits.topk(width, dim=-1)
    else:
        values, order = logits.sort(dim=-1, descending=True)
    ranks = torch.arange(width, device=device).view(1, 1, -1)
    limits = torch.tensor(top_k, device=device).view(-1, 1, 1)
    values = values.masked_fill(ranks >= limits, -torch.inf)
    if min(top_p) < 1.0:
        probs = values.softmax(dim=-1)
        mass_before = probs.cumsum(dim=-1) - probs
        drop = mass_before >= torch.tensor(top_p, device=device).view(-1, 1, 1)
        drop[..., 0] = False  # the best id always stays
        values = values.masked_fill(drop, -torch.inf)
    if max(min_p) > 0.0:  # relative to the best id, so the filters' order does not matter
        floor = values[..., :1] + torch.tensor(min_p, device=device).log().view(-1, 1, 1)
        values = values.masked_fill(values < floor, -torch.inf)
    probs = values.softmax(dim=-1)
    # Each sequence draws exactly top_k uniforms per codebook from its own generator, so its
    # choice does not depend on what else is in the batch. -log(1 - u) is Exp(1); the padding
    # past a sequence's top_k stays at u = 1, i.e. infinite noise, never chosen.
    uniform = torch.ones(num_seqs, num_codebooks, width, device=device)
    for index, seq in enumerate(seqs):
        uniform[index, :, : top_k[index]].uniform_(generator=seq.generator)
    noise = -torch.log1p(-uniform)
    pick = (probs / noise).argmax(dim=-1, keepdim=True)
    return order.gather(-1, pick)[..., 0]


def replay_draws(seq: Sequence, allowed: int, num_codebooks: int) -> None:
    """Advance ``seq``'s generator past one step's draws without sampling anything, as
    :func:`_draw` would have drawn them for a step that left ``allowed`` ids (its mask's
    size, the vocabulary without one) in each of ``num_codebooks``: a resumed stream does
    this for every row it had generated, so its next draw is the one it would have made.
    Greedy streams draw nothing."""
    if seq.sampling.greedy:
        return
    if not _ranks_candidates(seq):
        torch.empty(num_codebooks, 1, device=seq.generator.device).uniform_(generator=seq.generator)
        return
    top_k = min(seq.sampling.top_k or allowed, allowed)
    device = seq.generator.device
    torch.empty(num_codebooks, top_k, device=device).uniform_(generator=seq.generator)
