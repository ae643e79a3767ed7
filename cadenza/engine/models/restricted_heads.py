"""Output heads that compute only the logits a row position may emit.

A family whose layout says which ids each row position may be sampled from (its masks: an
Orpheus token at frame position ``k`` is one of codebook ``k``'s 4,096 codes, or the end of
speech at ``k = 0``) needs no logit for any other id: its head is split, once at load, into one
head per mask over that mask's ids (Orpheus: 4,097 of 156,940 rows per token). A step's logits
are then ``[S, 1, C]`` over the step's *columns*, the ids of every mask its rows are at, with
``-inf`` at the ids a row's own mask excludes; the sampler draws over those columns as it would
over the full vocabulary's allowed ids (:func:`~cadenza.engine.sampler.sample_rows`).

On CUDA the heads are one: a single head over the union of every mask's ids, each row's own
mask applied by a masked fill (``union``). A step then always has the same columns and shapes,
one product instead of one per mask present and nothing found per mask (at a batch holding
every mask, the same bytes read); the CPU keeps the split heads, which read a seventh of the
weights for a batch at one mask.
"""

from __future__ import annotations

import torch
from torch import nn

from cadenza.kernels.host_upload import upload


class RestrictedHeads(nn.Module):
    """One head per mask of ``masks [M, 1, V]`` (bool), each over its mask's ids, cut from the
    full head ``weight [V, H]``; with ``union`` (by default where ``weight`` is on CUDA) one
    head over every mask's ids instead. :meth:`step_masks`, :meth:`columns` and
    :meth:`logits` as the module says."""

    linears_giving_logits = ("heads", "union")
    allowed: torch.Tensor  # the union head's [M, C]: which of its columns each mask allows

    def __init__(
        self, weight: torch.Tensor, masks: torch.Tensor, union: bool | None = None
    ) -> None:
        super().__init__()
        if masks.dim() != 3 or masks.shape[1] != 1 or masks.shape[2] != weight.shape[0]:
            raise ValueError(f"masks {tuple(masks.shape)} do not fit a head of {weight.shape[0]}")
        self.vocab_size = weight.shape[0]
        self.device = weight.device  # where a step's columns and places are kept
        self.ids = [mask[0].nonzero().squeeze(1) for mask in masks]
        self._columns: dict[tuple[int, ...], tuple[torch.Tensor, dict[int, torch.Tensor]]] = {}
        self.heads = nn.ModuleList()
        self.union: nn.Linear | None = None
        if union if union is not None else weight.device.type == "cuda":
            columns, places = self._plan(tuple(range(len(self.ids))))
            self.union = _linear(weight.detach()[columns])
            allowed = torch.zeros(len(self.ids), len(columns), dtype=torch.bool)
            for mask, place in places.items():
                allowed[mask, place.cpu()] = True
            self.register_buffer("allowed", allowed.to(weight.device), persistent=False)
            return
        for ids in self.ids:
            self.heads.append(_linear(weight.detach()[ids]))

    @property
    def num_masks(self) -> int:
        return len(self.ids)

    def step_masks(self, present: set[int]) -> tuple[int, ...]:
        """The masks a step's logits cover when its rows are at masks ``present``: those, or
        every mask for the union head (its columns never change)."""
        if self.union is not None:
            return tuple(range(self.num_masks))
        return tuple(sorted(present))

    def columns(self, masks: tuple[int, ...]) -> torch.Tensor:
        """The ids the rows at ``masks`` (mask indices, sorted, distinct) may emit, sorted."""
        return self._plan(masks)[0]

    def logits(
        self, hidden: torch.Tensor, row_masks: list[int], masks: tuple[int, ...]
    ) -> torch.Tensor:
        """``hidden [S, H]`` of rows at mask ``row_masks[i]`` -> logits ``[S, 1, C]`` over
        :meth:`columns` of ``masks`` (which must hold every row's mask): each row's mask's ids
        computed by its head, ``-inf`` elsewhere. float32."""
        if self.union is not None:
            if masks != self.step_masks(set()):
                raise ValueError("the union head's logits cover every mask")
            rows = upload(row_masks, torch.long, hidden.device)
            logits = self.union(hidden).float()
            return logits.masked_fill(~self.allowed[rows], float("-inf"))[:, None, :]
        columns, places = self._plan(masks)
        out = torch.full((hidden.shape[0], len(columns)), float("-inf"), device=hidden.device)
        for mask in sorted(set(row_masks)):
            # The rows at this mask, found on the host (no read of the device's copy).
            at_mask = [row for row, row_mask in enumerate(row_masks) if row_mask == mask]
            rows = upload(at_mask, torch.long, hidden.device)
            values = self.heads[mask](hidden.index_select(0, rows)).float()
            out[rows[:, None], places[mask][None, :]] = values
        return out[:, None, :]

    def _plan(self, masks: tuple[int, ...]) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
        """The columns of ``masks`` and where each mask's ids sit among them, on the heads'
        device (found once on the host, then cached: a step uploads nothing)."""
        plan = self._columns.get(masks)
        if plan is None:
            ids = [self.ids[m].cpu() for m in masks]
            columns = torch.unique(torch.cat(ids))
            places = {m: torch.searchsorted(columns, i) for m, i in zip(masks, ids, strict=True)}
            plan = self._columns[masks] = (
                columns.to(self.device),
                {m: place.to(self.device) for m, place in places.items()},
            )
        return plan


def _linear(weight: torch.Tensor) -> nn.Linear:
    """A bias-free linear layer holding a copy of ``weight [out, in]``, on its device."""
    head = nn.Linear(weight.shape[1], weight.shape[0], bias=False, device=weight.device)
    head.weight = nn.Parameter(weight.clone(), requires_grad=False)
    return head
