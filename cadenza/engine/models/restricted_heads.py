"""Output heads that compute only the logits a row position may emit.

A family whose layout says which ids each row position may be sampled from (its masks: an
Orpheus token at frame position ``k`` is one of codebook ``k``'s 4,096 codes, or the end of
speech at ``k = 0``) needs no logit for any other id: its head is split, once at load, into one
head per mask over that mask's ids (Orpheus: 4,097 of 156,940 rows per token). A step's logits
are then ``[S, 1, C]`` over the step's *columns*, the ids of every mask its rows are at, with
``-inf`` at the ids a row's own mask excludes; the sampler draws over those columns as it would
over the full vocabulary's allowed ids (:func:`~cadenza.engine.sampler.sample_rows`).
"""

from __future__ import annotations

import torch
from torch import nn

from cadenza.engine.host_upload import upload


class RestrictedHeads(nn.Module):
    """One head per mask of ``masks [M, 1, V]`` (bool), each over its mask's ids, cut from the
    full head ``weight [V, H]``. :meth:`columns` and :meth:`logits` as the module says."""

    linears_giving_logits = ("heads",)

    def __init__(self, weight: torch.Tensor, masks: torch.Tensor) -> None:
        super().__init__()
        if masks.dim() != 3 or masks.shape[1] != 1 or masks.shape[2] != weight.shape[0]:
            raise ValueError(f"masks {tuple(masks.shape)} do not fit a head of {weight.shape[0]}")
        self.vocab_size = weight.shape[0]
        self.ids = [mask[0].nonzero().squeeze(1) for mask in masks]
        self.heads = nn.ModuleList()
        for ids in self.ids:
            head = nn.Linear(weight.shape[1], len(ids), bias=False, device=weight.device)
            head.weight = nn.Parameter(weight.detach()[ids].clone(), requires_grad=False)
            self.heads.append(head)
        self._columns: dict[tuple[int, ...], tuple[torch.Tensor, dict[int, torch.Tensor]]] = {}

    @property
    def num_masks(self) -> int:
        return len(self.ids)

    def columns(self, masks: tuple[int, ...]) -> torch.Tensor:
        """The ids the rows at ``masks`` (mask indices, sorted, distinct) may emit, sorted."""
        return self._plan(masks)[0]

    def logits(
        self, hidden: torch.Tensor, row_masks: list[int], masks: tuple[int, ...]
    ) -> torch.Tensor:
        """``hidden [S, H]`` of rows at mask ``row_masks[i]`` -> logits ``[S, 1, C]`` over
        :meth:`columns` of ``masks`` (which must hold every row's mask): each row's mask's ids
        computed by its head, ``-inf`` elsewhere. float32."""
        columns, places = self._plan(masks)
        out = torch.full((hidden.shape[0], len(columns)), float("-inf"), device=hidden.device)
        for mask in sorted(set(row_masks)):
            # The rows at this mask, found on the host (no read of the device's copy).
            at_mask = [row for row, row_mask in enumerate(row_masks) if row_mask == mask]
            rows = upload(at_mask, torch.long, hidden.device)
            values = self.heads[mask](hidden.index_select(0, rows)).float()
            out[rows[:, None], places[mask].to(out.device)[None, :]] = values
        return out[:, None, :]

    def _plan(self, masks: tuple[int, ...]) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
        """The columns of ``masks`` and where each mask's ids sit among them (cached)."""
        plan = self._columns.get(masks)
        if plan is None:
            columns = torch.unique(torch.cat([self.ids[m] for m in masks]))
            places = {m: torch.searchsorted(columns, self.ids[m]) for m in masks}
            plan = self._columns[masks] = (columns, places)
        return plan
