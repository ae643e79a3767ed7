"""Which ids each stream under a repetition penalty has seen, per codebook: one table on the
device, one row per stream.

The sampler reads the rows of a step's penalized streams in one gather and marks the ids it
drew in one scatter, from the drawn ids where they already are (nothing goes through the host
between steps). A stream's row is made from its token rows, on the host, the first time it is
penalized, and again whenever its rows are no longer the list the row was made from (a layout
that restarts its context replaces them); a row drawn and then never appended belongs to a
stream that ends with that step (a failure, an ending, an abort), whose row the runner frees
(:meth:`RepetitionState.retain`).
"""

from __future__ import annotations

import torch

from cadenza.engine.sequence import Sequence
from cadenza.kernels.host_upload import upload


class RepetitionState:
    """The seen-id table on ``device``: ``[streams, K, V]`` bool, grown as needed."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._table: torch.Tensor | None = None
        self._slots: dict[Sequence, int] = {}
        self._made_from: dict[Sequence, list[list[int]]] = {}  # the rows each slot was made of
        self._free: list[int] = []

    def seen(self, seqs: list[Sequence], num_codebooks: int, vocab_size: int) -> torch.Tensor:
        """``[S, K, V]`` bool: the ids each of ``seqs`` has seen in each codebook (prompt
        included)."""
        if self._table is None or self._table.shape[1:] != (num_codebooks, vocab_size):
            self._table = torch.zeros(
                4, num_codebooks, vocab_size, dtype=torch.bool, device=self.device
            )
            self._slots.clear()
            self._made_from.clear()
            self._free = list(range(4))
        slots = [self._slot(seq) for seq in seqs]
        return self._table.index_select(0, upload(slots, torch.long, self.device))

    def mark(self, seqs: list[Sequence], ids: torch.Tensor, first_codebook: int = 0) -> None:
        """Mark ``ids [S, K']`` (on the device, full-vocabulary ids) as seen by ``seqs``, in
        codebooks ``first_codebook ..``; every one of ``seqs`` must have been read by
        :meth:`seen`. One scatter."""
        if not seqs:
            return
        assert self._table is not None, "marks follow a read of the same streams"
        slots = upload([self._slots[seq] for seq in seqs], torch.long, self.device)
        width = ids.shape[1]
        codebooks = torch.arange(first_codebook, first_codebook + width, device=self.device)
        self._table[slots[:, None], codebooks[None, :], ids] = True

    def retain(self, running: list[Sequence]) -> None:
        """Free the rows of streams that are not ``running``."""
        keep = set(running)
        for seq in [seq for seq in self._slots if seq not in keep]:
            self._free.append(self._slots.pop(seq))
            del self._made_from[seq]

    def owners(self) -> list[Sequence]:
        """The streams that hold a row."""
        return list(self._slots)

    def _slot(self, seq: Sequence) -> int:
        """``seq``'s row, made now from its token rows if it has none or they changed."""
        table = self._table
        assert table is not None
        slot = self._slots.get(seq)
        if slot is not None and self._made_from[seq] is seq.token_rows:
            return slot
        if slot is None:
            if not self._free:
                grown = table.new_zeros((2 * len(table), *table.shape[1:]))
                grown[: len(table)] = table
                self._free = list(range(len(table), len(grown)))
                table = self._table = grown
            slot = self._slots[seq] = self._free.pop()
        num_codebooks, vocab_size = table.shape[1:]
        row = torch.zeros(num_codebooks, vocab_size, dtype=torch.bool)
        for token_row in seq.token_rows:
            for codebook, token in enumerate(token_row):
                if 0 <= token < vocab_size:
                    row[codebook, token] = True
        table[slot] = upload(row, torch.bool, self.device)
        self._made_from[seq] = seq.token_rows
        return slot
