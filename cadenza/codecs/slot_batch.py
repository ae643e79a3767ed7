"""The slots of one streaming decode call, known on the host and on the device.

A streaming decoder keeps state per slot (one slot a stream): tensors with a row a slot on the
codec's device (histories, LSTM states, attention windows) and host values (samples still to
drop, noise generators). A call's rows belong to some of the slots, and every stage needs both
views of them: the device's, to index its tensors, and the host's, for its lists. Reading the
host's view back from the device would make the host wait for the codec's queued work at every
stage of a GPU; a :class:`SlotBatch` carries both, uploaded once a call without blocking.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from cadenza.kernels.host_upload import upload


@dataclass(frozen=True)
class SlotBatch:
    """Row ``b`` of a call belongs to slot ``ids[b]``; ``index`` holds the same ids on the
    codec's device (``int64``), for indexing per-slot tensors."""

    ids: list[int]
    index: torch.Tensor

    @classmethod
    def on(cls, ids: list[int], device: torch.device | str) -> SlotBatch:
        """The slots ``ids``, uploaded to ``device``."""
        return cls(list(ids), upload(ids, torch.long, torch.device(device)))

    def __len__(self) -> int:
        return len(self.ids)

    def rows(self, rows: list[int]) -> SlotBatch:
        """The slots of ``rows`` only (indices into this batch), in that order."""
        ids = [self.ids[row] for row in rows]
        return SlotBatch(ids, self.index[upload(rows, torch.long, self.index.device)])
