"""A layout's sampling masks as the sampler applies them, planned once on the host.

A layout restricts each row to the ids of one of its masks (``[M, K, V]`` bool,
:meth:`~cadenza.engine.layouts.token_layout.TokenLayout.sampling_masks`). What the sampler
derives from the masks a batch is at depends on those masks alone, never on a step's values:

* the **columns**: when the masks in use allow at most half the vocabulary (one frame
  position's codes out of a text vocabulary), the sampler works on those ids only;
* the **excluded** ids of each row, over those columns, filled with ``-inf``;
* the **banned** ids of one mask shared by the whole batch, when it bans few (a layout's
  special tokens): filling those ids alone is several times cheaper on a CPU than a
  ``masked_fill`` broadcast over every row.

Finding those ids takes a ``nonzero``, a read of the device on a GPU. :class:`SamplingMasks`
finds them on its host copy of the masks the first time a set of masks is met, keeps the
results on the device, and answers every later step from them: a step's masks cost uploads
of its rows' mask indices at most, never a read.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from cadenza.kernels.host_upload import upload

# A shared mask banning at most one id in this many is applied by filling those ids alone.
FEW_BANNED = 4
# Plans kept per set of masks in use; a layout has few masks, so this bounds nothing real.
_MAX_PLANS = 1024


@dataclass(frozen=True)
class MaskPlan:
    """How one step's rows are masked.

    ``columns``: the ids the sampler keeps (on the device), ``None`` for all of them.
    ``excluded [1 or S, K, W]``: ``True`` where a row may not draw, over ``columns`` (one row
    broadcast when every row is at the same mask). ``banned``: with one shared mask, its
    excluded positions in the flattened ``[K * W]`` row, when few; else ``None``.
    """

    columns: torch.Tensor | None
    excluded: torch.Tensor
    banned: torch.Tensor | None


@dataclass(frozen=True)
class _Narrowing:
    columns: torch.Tensor | None
    excluded: torch.Tensor  # [M, K, W] on the device
    banned: dict[int, torch.Tensor | None]


class SamplingMasks:
    """A layout's masks ``[M, K, V]`` (bool, any device) on ``device``, with the plans
    :meth:`plan` makes from their host copy, kept per set of masks in use."""

    def __init__(self, masks: torch.Tensor, device: torch.device | str) -> None:
        if masks.dim() != 3 or masks.dtype != torch.bool:
            raise ValueError(
                f"sampling masks must be bool [masks, codebooks, vocab], got "
                f"{masks.dtype} {list(masks.shape)}"
            )
        self.host = masks.detach().to("cpu")
        self.device = torch.device(device)
        self.count, self.width, self.vocab = self.host.shape
        self._excluded = (~self.host).to(self.device)  # over the whole vocabulary
        self._narrowings: dict[frozenset[int], _Narrowing] = {}
        self._codebooks: dict[tuple[int, int], SamplingMasks] = {}

    def codebooks(self, first: int, count: int) -> SamplingMasks:
        """The masks of codebooks ``first .. first + count`` (a depth decoder samples a row
        one codebook at a time), with plans of their own, made once."""
        if first < 0 or count < 1 or first + count > self.width:
            raise ValueError(f"codebooks {first}..{first + count} out of {self.width}")
        key = (first, count)
        if key not in self._codebooks:
            self._codebooks[key] = SamplingMasks(self.host[:, first : first + count], self.device)
        return self._codebooks[key]

    def plan(self, which: list[int]) -> MaskPlan:
        """The plan of a step whose row ``i`` is at mask ``which[i]``."""
        if not which:
            raise ValueError("a step's mask plan needs at least one row")
        used = frozenset(which)
        if min(used) < 0 or max(used) >= self.count:
            raise ValueError(f"mask index out of range: {sorted(used)} of {self.count} masks")
        narrowing = self._narrowing(used)
        if len(used) == 1:
            (index,) = used
            excluded = narrowing.excluded[index : index + 1]
            return MaskPlan(narrowing.columns, excluded, narrowing.banned[index])
        rows = upload(which, torch.long, self.device)
        return MaskPlan(narrowing.columns, narrowing.excluded.index_select(0, rows), None)

    def _narrowing(self, used: frozenset[int]) -> _Narrowing:
        """The columns, excluded ids and banned ids of the masks ``used``, found on the host
        the first time they are met."""
        known = self._narrowings.get(used)
        if known is not None:
            return known
        if len(self._narrowings) >= _MAX_PLANS:
            self._narrowings.clear()
        allowed = self.host[sorted(used)].any(dim=1).any(dim=0)
        ids = allowed.nonzero().squeeze(1)
        columns: torch.Tensor | None = None
        host_allowed, excluded = self.host, self._excluded
        if ids.numel() <= self.vocab // 2:
            columns = ids.to(self.device)
            host_allowed = self.host.index_select(-1, ids)
            excluded = (~host_allowed).to(self.device)
        banned: dict[int, torch.Tensor | None] = {}
        for index in used:
            flat = (~host_allowed[index]).flatten().nonzero().squeeze(1)
            few = FEW_BANNED * flat.numel() <= host_allowed[index].numel()
            banned[index] = flat.to(self.device) if few else None
        narrowing = _Narrowing(columns, excluded, banned)
        self._narrowings[used] = narrowing
        return narrowing
