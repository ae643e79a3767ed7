"""A layout's masks planned once on the host: the plans equal what the masks say, a known set of
masks costs no read of the device, and the sampler draws the same through a plan that narrows
the vocabulary as over the whole of it."""

import pytest
import torch

from cadenza.contract.sampling import SamplingParams
from cadenza.engine.device_audit import DeviceAudit
from cadenza.engine.sampler import sample_ids
from cadenza.engine.sampling_masks import SamplingMasks
from cadenza.engine.sequence import Sequence


def _positions(vocab: int = 40, positions: int = 3, width: int = 5) -> torch.Tensor:
    """A flat layout's masks: position ``p`` allows ids ``p * width .. p * width + width``
    (one frame position's codes out of a text vocabulary) and the end id, ``vocab - 1``."""
    masks = torch.zeros(positions, 1, vocab, dtype=torch.bool)
    for p in range(positions):
        masks[p, 0, p * width : (p + 1) * width] = True
    masks[:, 0, vocab - 1] = True
    return masks


def _seq(params: SamplingParams, seed: int) -> Sequence:
    return Sequence("s", [[0]], params, torch.Generator().manual_seed(seed), max_new_steps=10)


def test_a_plan_keeps_the_masks_ids_and_excludes_the_rest_per_row() -> None:
    masks = _positions()
    plan = SamplingMasks(masks, "cpu").plan([0, 2, 0])
    assert plan.columns is not None
    assert plan.columns.tolist() == [0, 1, 2, 3, 4, 10, 11, 12, 13, 14, 39]
    expected = ~masks[[0, 2, 0]].index_select(-1, plan.columns)
    assert torch.equal(plan.excluded, expected) and plan.banned is None


def test_one_shared_mask_that_bans_few_ids_names_them() -> None:
    masks = torch.ones(3, 2, 30, dtype=torch.bool)
    masks[0, 1, 7] = masks[0, 0, 29] = False  # special tokens
    masks[1, 0, 10:] = False  # bans a third of the row: masked whole
    masks[2, :, 10:] = False  # two thirds of the vocabulary: the columns left, none banned
    sampling = SamplingMasks(masks, "cpu")
    shared = sampling.plan([0, 0, 0])
    assert shared.columns is None and shared.excluded.shape == (1, 2, 30)
    assert shared.banned is not None and sorted(shared.banned.tolist()) == [29, 30 + 7]
    assert sampling.plan([1, 1]).banned is None
    narrowed = sampling.plan([2, 2])
    assert narrowed.columns is not None and narrowed.columns.tolist() == list(range(10))
    assert narrowed.banned is not None and narrowed.banned.numel() == 0


def test_a_set_of_masks_is_planned_once_and_then_reads_nothing() -> None:
    sampling = SamplingMasks(_positions(), "cpu")
    with DeviceAudit() as first:
        sampling.plan([1, 0])
    with DeviceAudit() as again:
        for rows in ([0, 1], [1, 0, 1], [0, 1, 1, 0]):  # the same set of masks, any rows
            sampling.plan(rows)
    assert first.host_reads > 0 and again.host_reads == 0
    assert sampling.codebooks(0, 1) is sampling.codebooks(0, 1)


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=0.0, top_k=0),
        SamplingParams(temperature=1.0, top_k=4, seed=5),  # thresholded
        SamplingParams(temperature=1.0, top_k=0, top_p=0.9, seed=5),  # ranked
    ],
)
def test_draws_through_a_narrowing_plan_equal_draws_over_the_masked_vocabulary(params) -> None:
    masks = _positions()
    which = [0, 1, 2, 1]
    logits = torch.randn(len(which), 1, masks.shape[-1], generator=torch.Generator().manual_seed(0))
    seqs = [_seq(params, seed) for seed in range(len(which))]
    planned = SamplingMasks(masks, "cpu")
    planned.plan(which)  # planned ahead, as a runner's masks are after their first step
    with DeviceAudit() as audit:
        narrowed = sample_ids(logits, seqs, planned, [(m, None) for m in which])
    whole = sample_ids(
        logits.masked_fill(~masks[which], float("-inf")), seqs, None, [(0, None)] * len(which)
    )
    assert torch.equal(narrowed, whole)
    assert all(masks[m, 0, i] for m, i in zip(which, narrowed[:, 0].tolist(), strict=True))
    assert audit.reads.get("nonzero", 0) == 0 and audit.reads.get("tolist", 0) == 0


def test_garbage_masks_and_indices_are_refused() -> None:
    with pytest.raises(ValueError, match="bool"):
        SamplingMasks(torch.ones(2, 1, 4), "cpu")
    with pytest.raises(ValueError, match="bool"):
        SamplingMasks(torch.ones(1, 4, dtype=torch.bool), "cpu")
    sampling = SamplingMasks(_positions(), "cpu")
    with pytest.raises(ValueError, match="out of range"):
        sampling.plan([0, 3])
    with pytest.raises(ValueError, match="out of range"):
        sampling.plan([-1])
    with pytest.raises(ValueError, match="at least one row"):
        sampling.plan([])
    with pytest.raises(ValueError, match="codebooks"):
        sampling.codebooks(0, 2)
