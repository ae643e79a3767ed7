"""Ragged batches for streaming decoders: row ``b`` of a ``[B, C, T]`` tensor holds
``lengths[b]`` valid time steps, the rest is padding whose values mean nothing."""

from __future__ import annotations

import torch

Lengths = list[int]


def pad_batch(pieces: list[torch.Tensor], channels: int, like: torch.Tensor) -> torch.Tensor:
    """``[C, n_b]`` pieces as one zero-padded ``[B, C, max n_b]`` tensor."""
    longest = max((p.shape[-1] for p in pieces), default=0)
    out = like.new_zeros(len(pieces), channels, longest)
    for index, piece in enumerate(pieces):
        out[index, :, : piece.shape[-1]] = piece
    return out


def gather_windows(full: torch.Tensor, starts: torch.Tensor, width: int) -> torch.Tensor:
    """``full[b, :, starts[b] : starts[b] + width]`` for every ``b``, as one tensor."""
    index = starts[:, None] + torch.arange(width, device=full.device)[None, :]
    return full.gather(2, index[:, None, :].expand(-1, full.shape[1], -1))


def zero_padding(x: torch.Tensor, lengths: Lengths) -> torch.Tensor:
    """``x`` with every row's padding set to zero."""
    if all(n == x.shape[-1] for n in lengths):
        return x
    valid = (
        torch.arange(x.shape[-1], device=x.device)[None, :]
        < torch.tensor(lengths, device=x.device)[:, None]
    )
    return x * valid[:, None, :]


class RaggedStage:
    """One layer of a streaming decoder over ragged batches, with per-slot state."""

    def forward(
        self, x: torch.Tensor, lengths: Lengths, slots: torch.Tensor, final: list[bool]
    ) -> tuple[torch.Tensor, Lengths]:
        """New input for the slots ``slots`` (``final``: their streams end here) -> new
        output and each row's length."""
        raise NotImplementedError

    def reset(self, slot: int) -> None:
        """Forget a slot's state (it is about to carry a new stream)."""
