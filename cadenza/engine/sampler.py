"""Batched sampling of one row per sequence: repetition penalty, masks, greedy or
temperature / top-k / top-p, forced ids.

Every draw takes one uniform per codebook, made on the device from the stream's seed, the rows
it has drawn and the codebook (:mod:`cadenza.engine.stream_draws`): a seeded request samples
the same ids whatever else shares its batch, a resumed one draws on as it would have, and the
step reads nothing back before its ids are chosen (:func:`sample_ids` leaves them on the
device; the runner reads them with the step's NaN flags, once). Two ways to draw, chosen per
sequence by its own settings (never by the batch), both by inverse CDF:

- without top-p, the candidates are the ids at least as likely as the k-th best (and, with
  ``min_p``, as the floor it sets): one threshold per row, found by a partial partition, no
  ranking; the uniform picks an id over the candidates in id order. This is the serving
  default: on a CPU the whole draw costs about half of what the ranked draw below does
  (``topk`` alone is ~1.5 ms over a 16-stream cadenza-tiny batch;
  docs/journal/2026-12-01-sampling-by-threshold-codecs-time-major.md), and where a C++
  compiler is found it is one native call (:mod:`cadenza.kernels.cpu_sampling`, the same
  arithmetic per row).
- with top-p, the nucleus needs the candidates' mass in rank order: top-k (or a sort), the
  nucleus cut, then the uniform picks an id over the candidates in rank order.

Everything else is one batched tensor operation over ``[S, K, V]``. Values a step uploads
(temperatures, limits, indices) go through :func:`~cadenza.kernels.host_upload.upload`.
"""

from __future__ import annotations

import numpy as np
import torch

from cadenza.engine.repetition_state import RepetitionState
from cadenza.engine.sampling_masks import MaskPlan, SamplingMasks
from cadenza.engine.sequence import Sequence
from cadenza.engine.stream_draws import stream_uniforms
from cadenza.kernels import cpu_sampling
from cadenza.kernels.host_upload import upload


def sample_rows(
    logits: torch.Tensor,
    seqs: list[Sequence],
    masks: SamplingMasks | torch.Tensor | None,
    constraints: list[tuple[int, list[int | None] | None]],
    codebook: int = 0,
    columns: torch.Tensor | None = None,
    repetition: RepetitionState | None = None,
) -> list[list[int]]:
    """:func:`sample_ids`, read to the host: one row of ``K`` ids per sequence."""
    ids = sample_ids(logits, seqs, masks, constraints, codebook, columns, repetition)
    rows: list[list[int]] = ids.tolist()
    return rows


def sample_ids(
    logits: torch.Tensor,
    seqs: list[Sequence],
    masks: SamplingMasks | torch.Tensor | None,
    constraints: list[tuple[int, list[int | None] | None]],
    codebook: int = 0,
    columns: torch.Tensor | None = None,
    repetition: RepetitionState | None = None,
) -> torch.Tensor:
    """``logits [S, K, V]`` -> ids ``[S, K]`` (int64, on the logits' device), one row per
    sequence; nothing is read back to the host (masks given as a bare tensor are planned on a
    host copy, made by this call: serving passes :class:`SamplingMasks`, planned once).
    ``repetition``: the engine's seen-id table, read for the penalized sequences and marked
    with what they drew (without one, a table made from their token rows for this call).

    ``masks [M, K, V]`` bool or their :class:`SamplingMasks` (``None``: no restriction) with
    ``constraints[i] = (mask index, forced ids or None)`` for sequence ``i``. Forced ids
    replace the sampled ones. When the masks leave at most half the vocabulary, everything
    works on the allowed ids only (same result: an excluded id can never be drawn).
    ``codebook``: the row's first codebook, for a part of a row (a depth decoder samples a
    row one codebook at a time); the repetition penalty then looks at the ids seen in those
    codebooks. ``columns``: the ids ``logits``
    are over when a restricted head computed only those
    (:class:`~cadenza.engine.models.restricted_heads.RestrictedHeads`; ``masks`` required),
    whose logits are already ``-inf`` outside each row's mask: the mask is not applied again.
    """
    logits = logits.float()
    num_seqs, _, vocab = logits.shape
    device = logits.device
    if isinstance(masks, torch.Tensor):
        masks = SamplingMasks(masks, device)
    plan: MaskPlan | None = None
    if columns is not None:  # logits already over a restricted head's columns, masked by it
        assert masks is not None, "restricted logits need the masks they were cut by"
        vocab = masks.vocab
        columns = columns.to(device)
    elif masks is not None:
        plan = masks.plan([c[0] for c in constraints])
        columns = plan.columns
        if columns is not None:  # e.g. one frame position's codes out of a text vocab
            logits = logits.index_select(-1, columns)
    penalized = [i for i, s in enumerate(seqs) if s.sampling.repetition_penalty != 1.0]
    if penalized:
        width = logits.shape[1]
        row_width = len(seqs[0].token_rows[0])
        state = repetition or RepetitionState(device)
        seen = state.seen([seqs[i] for i in penalized], row_width, vocab)
        seen = seen[:, codebook : codebook + width]
        if columns is not None:
            seen = seen.index_select(-1, columns)
        penalty = upload(
            [seqs[i].sampling.repetition_penalty for i in penalized], torch.float32, device
        )
        penalty = penalty.view(-1, 1, 1)
        if len(penalized) == num_seqs:
            logits = torch.where(seen, _penalized(logits, penalty), logits)
        else:
            rows = upload(penalized, torch.long, device)
            sub = logits.index_select(0, rows)
            logits = logits.index_copy(0, rows, torch.where(seen, _penalized(sub, penalty), sub))
    if plan is not None:
        logits = _exclude(logits, plan)

    random = [i for i, s in enumerate(seqs) if not s.sampling.greedy]
    if len(random) == num_seqs:  # the usual serving batch: no argmax to throw away
        chosen = _draw(seqs, logits, codebook)
    else:
        chosen = logits.argmax(dim=-1)
        if random:
            rows = upload(random, torch.long, device)
            drawn = _draw([seqs[i] for i in random], logits.index_select(0, rows), codebook)
            chosen = chosen.index_copy(0, rows, drawn)
    # In range even for a row of NaN (whose draw falls past the end): the caller fails
    # such a row, but reads its ids with the others first.
    chosen = chosen.clamp(0, logits.shape[-1] - 1)
    if columns is not None:
        chosen = columns[chosen]
    forced = [f for _, f in constraints]
    if any(f is not None for f in forced):
        width = chosen.shape[1]
        spelled = [
            [-1] * width if f is None else [-1 if t is None else t for t in f] for f in forced
        ]
        wanted = upload(spelled, torch.long, device)
        chosen = torch.where(wanted >= 0, wanted, chosen)
    if penalized and repetition is not None:
        drawn = chosen
        if len(penalized) < num_seqs:
            drawn = chosen.index_select(0, upload(penalized, torch.long, device))
        repetition.mark([seqs[i] for i in penalized], drawn, codebook)
    return chosen


def _penalized(logits: torch.Tensor, penalty: torch.Tensor) -> torch.Tensor:
    """Logits under the repetition penalty (transformers' rule: positive ones divided by
    it, negative ones multiplied)."""
    return torch.where(logits > 0, logits / penalty, logits * penalty)


def _exclude(logits: torch.Tensor, plan: MaskPlan) -> torch.Tensor:
    """``logits [S, K, W]`` with ``-inf`` wherever ``plan`` excludes, as a new tensor
    (``logits`` itself where it excludes nothing). One mask for several rows that bans few
    ids (a layout's special tokens) is filled at those ids only: ``masked_fill`` broadcasting
    the mask over every row took 150 us for ten cadenza-tiny rows on the CPU, filling the
    banned ids 12 (for one row, ``masked_fill`` is the cheaper)."""
    if plan.banned is not None and plan.banned.numel() == 0:
        return logits
    if plan.banned is not None and logits.shape[0] > 1:
        out = logits.clone(memory_format=torch.contiguous_format)
        out.view(out.shape[0], -1).index_fill_(1, plan.banned, float("-inf"))
        return out
    return logits.masked_fill(plan.excluded, float("-inf"))


def _draw(seqs: list[Sequence], logits: torch.Tensor, codebook: int) -> torch.Tensor:
    """Sample one id per codebook for each sequence from its top-k / top-p / min-p candidates,
    each sequence the way its own settings call for (see the module docstring), with the
    uniforms of its next row at codebooks ``codebook ..``."""
    uniform = stream_uniforms(seqs, codebook, logits.shape[1], logits.device)
    ranked = [i for i, s in enumerate(seqs) if _ranks_candidates(s)]
    if not ranked:
        return _draw_thresholded(seqs, logits, uniform)
    if len(ranked) == len(seqs):
        return _draw_ranked(seqs, logits, uniform)
    rest = [i for i, s in enumerate(seqs) if not _ranks_candidates(s)]
    at_rank, at_rest = (upload(i, torch.long, logits.device) for i in (ranked, rest))
    chosen = torch.empty(logits.shape[:2], dtype=torch.long, device=logits.device)
    chosen[at_rank] = _draw_ranked([seqs[i] for i in ranked], logits[at_rank], uniform[at_rank])
    chosen[at_rest] = _draw_thresholded([seqs[i] for i in rest], logits[at_rest], uniform[at_rest])
    return chosen


def _ranks_candidates(seq: Sequence) -> bool:
    """Whether ``seq`` draws by rank (top-p needs its candidates' mass in rank order)."""
    return seq.sampling.top_p < 1.0


def _draw_thresholded(
    seqs: list[Sequence], logits: torch.Tensor, uniform: torch.Tensor
) -> torch.Tensor:
    """One id per codebook for each sequence, among the ids at least as likely as its k-th
    best (and its ``min_p`` floor), by inverse CDF in id order with ``uniform [S, K]``. Ties
    at the k-th value are all candidates."""
    device = logits.device
    vocab = logits.shape[-1]
    top_k = [min(s.sampling.top_k or vocab, vocab) for s in seqs]
    if device.type == "cpu" and cpu_sampling.available():
        return cpu_sampling.draw_thresholded(
            logits,
            [s.sampling.temperature for s in seqs],
            top_k,
            [s.sampling.min_p for s in seqs],
            uniform,
        )
    temperature = upload([s.sampling.temperature for s in seqs], torch.float32, device)
    logits = logits / temperature.view(-1, 1, 1)
    threshold = _kth_largest(logits, top_k)
    best = logits.amax(dim=-1, keepdim=True)
    min_p = upload([s.sampling.min_p for s in seqs], torch.float32, device).view(-1, 1, 1)
    if any(s.sampling.min_p > 0 for s in seqs):  # relative to the best id: order-free filters
        threshold = torch.maximum(threshold, best + min_p.log())
    # A masked id (-inf) is never a candidate, even when fewer than k ids are allowed.
    threshold = threshold.clamp(min=torch.finfo(logits.dtype).min)
    # 1 where logits >= threshold, else 0, in float ops (a broadcast comparison that makes a
    # bool tensor is several times slower on a CPU).
    keep = (logits - threshold).sign_().add_(1.0).clamp_(max=1.0)
    weights = (logits - best).exp_().mul_(keep)
    cdf = weights.cumsum_(dim=-1)
    return _inverse_cdf(cdf, uniform)


def _inverse_cdf(cdf: torch.Tensor, uniform: torch.Tensor) -> torch.Tensor:
    """``[S, K]``: where ``uniform [S, K]`` of the way through each row's cumulative weights
    ``cdf [S, K, W]`` falls (the first index whose cumulative weight exceeds it)."""
    total = cdf[..., -1:]
    # Below the total, so the first cdf entry above the target is a candidate's (a non-zero
    # weight), even when u * total rounds up.
    target = torch.minimum(
        uniform[..., None] * total, torch.nextafter(total, torch.zeros_like(total))
    )
    # In range even for a row of NaN (or no candidate), whose target falls past the end: the
    # caller fails such a row, but indexes with its pick before it knows.
    index = torch.searchsorted(cdf, target, right=True)[..., 0]
    return index.clamp(max=cdf.shape[-1] - 1)


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
    index = upload(where, torch.long, logits.device).view(-1, 1, 1)
    return values.gather(-1, index.expand(num_seqs, num_codebooks, 1))


def _draw_ranked(seqs: list[Sequence], logits: torch.Tensor, uniform: torch.Tensor) -> torch.Tensor:
    """One id per codebook for each sequence from its top-k / top-p / min-p candidates, by
    inverse CDF in rank order with ``uniform [S, K]``."""
    device = logits.device
    vocab = logits.shape[-1]
    temperature = upload([s.sampling.temperature for s in seqs], torch.float32, device)
    logits = logits / temperature.view(-1, 1, 1)
    top_k = [min(s.sampling.top_k or vocab, vocab) for s in seqs]
    top_p = [s.sampling.top_p for s in seqs]
    min_p = [s.sampling.min_p for s in seqs]
    width = max(top_k)
    # Candidates, best first: top-k needs only the best ``width`` ids, not a full sort. Ids a
    # mask excluded (-inf) rank last and weigh nothing.
    if width < vocab:
        values, order = logits.topk(width, dim=-1)
    else:
        values, order = logits.sort(dim=-1, descending=True)
    ranks = torch.arange(width, device=device).view(1, 1, -1)
    limits = upload(top_k, torch.long, device).view(-1, 1, 1)
    values = values.masked_fill(ranks >= limits, -torch.inf)
    if min(top_p) < 1.0:
        probs = values.softmax(dim=-1)
        mass_before = probs.cumsum(dim=-1) - probs
        drop = mass_before >= upload(top_p, torch.float32, device).view(-1, 1, 1)
        drop[..., 0] = False  # the best id always stays
        values = values.masked_fill(drop, -torch.inf)
    if max(min_p) > 0.0:  # relative to the best id, so the filters' order does not matter
        floor = values[..., :1] + upload(min_p, torch.float32, device).log().view(-1, 1, 1)
        values = values.masked_fill(values < floor, -torch.inf)
    cdf = values.softmax(dim=-1).cumsum(dim=-1)
    pick = _inverse_cdf(cdf, uniform)
    return order.gather(-1, pick[..., None])[..., 0]
