"""Restricted heads: each mask's logits equal the full head's at its ids, -inf at the columns
it excludes, over the union of the step's masks."""

from __future__ import annotations

import pytest
import torch

from cadenza.engine.layouts.flat import FlatLayout
from cadenza.engine.models.restricted_heads import RestrictedHeads


def _heads() -> tuple[torch.Tensor, torch.Tensor, RestrictedHeads]:
    layout = FlatLayout(3, 8, audio_token_offset=40, eos_id=5, vocab_size=80)
    masks = layout.sampling_masks()
    assert masks is not None
    weight = torch.randn(80, 16)
    return weight, masks, RestrictedHeads(weight, masks)


def test_each_row_gets_its_masks_logits_and_minus_inf_elsewhere() -> None:
    weight, masks, heads = _heads()
    assert [len(ids) for ids in heads.ids] == [9, 8, 8]  # codebook 0 has the end of speech too
    hidden = torch.randn(4, 16)
    row_masks = [0, 2, 2, 0]
    logits = heads.logits(hidden, row_masks, (0, 2))
    columns = heads.columns((0, 2))
    assert logits.shape == (4, 1, len(columns)) and logits.dtype == torch.float32
    full = hidden @ weight.T
    for row, mask in enumerate(row_masks):
        allowed = masks[mask, 0, columns]
        torch.testing.assert_close(logits[row, 0, allowed], full[row, columns[allowed]])
        assert torch.isneginf(logits[row, 0, ~allowed]).all()


def test_columns_are_the_sorted_union_of_the_masks_ids() -> None:
    _, masks, heads = _heads()
    columns = heads.columns((1, 2))
    expected = (masks[1, 0] | masks[2, 0]).nonzero().squeeze(1)
    assert torch.equal(columns, expected)


def test_masks_that_do_not_fit_the_head_are_refused() -> None:
    with pytest.raises(ValueError, match="do not fit"):
        RestrictedHeads(torch.randn(10, 4), torch.ones(2, 1, 12, dtype=torch.bool))


def test_the_union_head_gives_every_row_its_mask_s_logits_over_every_mask_s_ids() -> None:
    """CUDA's one head (forced here on the CPU): the same logits as the split heads at each
    row's mask, over columns that never change, so a step's shapes do not either."""
    weight, masks, split = _heads()
    union = RestrictedHeads(weight, masks, union=True)
    assert len(union.heads) == 0 and union.union is not None and split.union is None
    everything = union.step_masks({2})
    assert everything == (0, 1, 2) and split.step_masks({2, 0}) == (0, 2)
    hidden = torch.randn(5, 16)
    row_masks = [0, 2, 1, 2, 0]
    logits = union.logits(hidden, row_masks, everything)
    assert logits.shape == (5, 1, len(union.columns(everything)))
    torch.testing.assert_close(logits, split.logits(hidden, row_masks, everything))
    with pytest.raises(ValueError, match="every mask"):
        union.logits(hidden, row_masks, (0, 2))
