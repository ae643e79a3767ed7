"""Streaming stages every convolutional codec decoder has (EnCodec's and Mimi's SEANet):
ELU, identity, and the residual block ``shortcut(x) + block(x)``; and the plain weight of a
convolution whose weight normalisation was folded at load."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn.utils import parametrize

from cadenza.codecs.codec import CodecError
from cadenza.codecs.ragged import Lengths, RaggedStage
from cadenza.kernels import cpu_elu


def plain_weight(module: nn.Module) -> torch.Tensor:
    """``module``'s effective weight; :class:`CodecError` if weight normalisation is still a
    parametrization (the codec loaders fold it)."""
    if parametrize.is_parametrized(module, "weight"):
        raise CodecError("fold weight normalisation before streaming (the codec loaders do)")
    weight = module.weight
    assert isinstance(weight, torch.Tensor)
    return weight.detach()


class Elu(RaggedStage):
    """ELU through :func:`cadenza.kernels.cpu_elu.elu` (a native kernel on the CPU, several
    times torch's speed there; ``F.elu`` elsewhere)."""

    def __init__(self, layer: nn.ELU, inplace: bool) -> None:
        self.alpha = layer.alpha
        self.inplace = inplace  # only where no other branch reads the input

    def forward(
        self, x: torch.Tensor, lengths: Lengths, slots: torch.Tensor, final: list[bool]
    ) -> tuple[torch.Tensor, Lengths]:
        return cpu_elu.elu(x, self.alpha, inplace=self.inplace), lengths


class Identity(RaggedStage):
    def forward(
        self, x: torch.Tensor, lengths: Lengths, slots: torch.Tensor, final: list[bool]
    ) -> tuple[torch.Tensor, Lengths]:
        return x, lengths


class Residual(RaggedStage):
    """``shortcut(x) + block(x)``, both branches keeping every row's length in step. The
    block's first stage must not work in place (the shortcut reads the same input)."""

    def __init__(self, block: list[RaggedStage], shortcut: RaggedStage) -> None:
        self.block = block
        self.shortcut = shortcut

    def reset(self, slot: int) -> None:
        for stage in [*self.block, self.shortcut]:
            stage.reset(slot)

    def forward(
        self, x: torch.Tensor, lengths: Lengths, slots: torch.Tensor, final: list[bool]
    ) -> tuple[torch.Tensor, Lengths]:
        if x.shape[-1] == 0:
            return x, lengths
        h, block_lengths = x, lengths
        for stage in self.block:
            h, block_lengths = stage.forward(h, block_lengths, slots, final)
        skip, skip_lengths = self.shortcut.forward(x, lengths, slots, final)
        if block_lengths != skip_lengths:
            raise CodecError("residual branches fell out of step")
        return add_into_fresh(h, skip[:, :, : h.shape[-1]], x), skip_lengths


def add_into_fresh(h: torch.Tensor, skip: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """``h + skip``, written into ``h`` when ``h`` is a branch's own new tensor (not sharing
    storage with the stage input ``x`` nor with ``skip``): a fresh tensor of a decoder's size
    costs more to allocate than the addition itself."""
    storage = h.untyped_storage().data_ptr()
    if storage in (x.untyped_storage().data_ptr(), skip.untyped_storage().data_ptr()):
        return h + skip
    return h.add_(skip)
