import pytest
import torch
from transformers.generation.logits_process import RepetitionPenaltyLogitsProcessor

from cadenza.contract.sampling import SamplingParams
from cadenza.engine.sampler import _exclude, sample_ids, sample_rows
from cadenza.engine.sampling_masks import SamplingMasks
from cadenza.engine.sequence import Sequence


def _seq(params, rows=((0,),), seed=0):
    generator = torch.Generator().manual_seed(seed if params.seed is None else params.seed)
    return Sequence("s", [list(r) for r in rows], params, generator, max_new_steps=100)


def _free(n):
    return [(0, None)] * n


def _draws(logits, seq, masks, constraints, count):
    """``count`` rows drawn one after another by ``seq`` (each advances its draw counter, as
    appending a row does)."""
    rows = []
    for _ in range(count):
        rows.append(sample_rows(logits, [seq], masks, constraints)[0])
        seq.rows_drawn += 1
    return rows


GREEDY = SamplingParams(temperature=0.0, top_k=0)


def test_greedy_takes_the_best_allowed_id():
    logits = torch.tensor([[[0.0, 5.0, 1.0], [3.0, 0.0, 1.0]]])
    masks = torch.tensor([[[True, False, True], [True, True, True]]])
    rows = sample_rows(logits, [_seq(GREEDY, rows=((0, 0),))], masks, _free(1))
    assert rows == [[2, 0]]


def test_forced_ids_win_and_mask_index_selects_the_mask():
    logits = torch.zeros(1, 2, 4)
    masks = torch.stack([torch.ones(2, 4, dtype=torch.bool), torch.eye(4, dtype=torch.bool)[:2]])
    seq = _seq(GREEDY, rows=((0, 0),))
    assert sample_rows(logits, [seq], masks, [(0, [None, 3])])[0][1] == 3
    assert sample_rows(logits, [seq], masks, [(1, None)]) == [[0, 1]]


def test_seeded_draws_do_not_depend_on_the_batch():
    torch.manual_seed(0)
    logits = torch.randn(3, 4, 50)
    params = SamplingParams(temperature=1.0, top_k=20, seed=11)
    alone = sample_rows(logits[1:2], [_seq(params)], None, _free(1))
    others = [_seq(SamplingParams(seed=1)), _seq(params), _seq(GREEDY)]
    batched = sample_rows(logits, others, None, _free(3))
    assert batched[1] == alone[0]
    assert batched[2] == logits[2].argmax(-1).tolist()


def test_top_k_limits_choice():
    torch.manual_seed(1)
    logits = torch.randn(1, 4, 50)
    top3 = torch.topk(logits[0], 3, dim=-1).indices
    seq = _seq(SamplingParams(temperature=1.0, top_k=3), seed=5)
    for row in _draws(logits, seq, None, _free(1), 50):
        assert all(row[k] in top3[k].tolist() for k in range(4))


def test_top_p_keeps_the_nucleus():
    logits = torch.log(torch.tensor([[[0.6, 0.3, 0.05, 0.05]]]))
    seq = _seq(SamplingParams(temperature=1.0, top_k=0, top_p=0.8), seed=2)
    seen = {row[0] for row in _draws(logits, seq, None, _free(1), 200)}
    assert seen == {0, 1}


def test_temperature_sampling_follows_the_distribution():
    logits = torch.log(torch.tensor([[[0.7, 0.2, 0.1]]]))
    seq = _seq(SamplingParams(temperature=1.0, top_k=0), seed=3)
    draws = [row[0] for row in _draws(logits, seq, None, _free(1), 3000)]
    share = draws.count(0) / len(draws)
    assert 0.65 < share < 0.75


def test_repetition_penalty_matches_transformers():
    torch.manual_seed(2)
    history = [[5], [9], [5], [30]]
    logits = torch.randn(1, 1, 40) * 3
    params = SamplingParams(temperature=0.0, top_k=0, repetition_penalty=1.7)
    seq = _seq(params, rows=history)
    expected = RepetitionPenaltyLogitsProcessor(1.7)(
        torch.tensor([[r[0] for r in history]]), logits[:, 0].clone()
    )
    assert sample_rows(logits, [seq], None, _free(1)) == [[int(expected.argmax())]]


@pytest.mark.parametrize(
    "kwargs",
    [{"temperature": -1}, {"top_k": -1}, {"top_p": 0}, {"top_p": 1.5}, {"repetition_penalty": 0}],
)
def test_invalid_params(kwargs):
    with pytest.raises(ValueError):
        SamplingParams(**kwargs)


def test_top_k_draws_follow_the_renormalised_distribution():
    # Without top-p the candidates are found by threshold and drawn by inverse CDF: the share
    # of each id must match the softmax over the top k, and nothing else is ever drawn.
    logits = torch.log(torch.tensor([[[0.05, 0.4, 0.1, 0.3, 0.15]]]))
    seq = _seq(SamplingParams(temperature=1.0, top_k=3), seed=7)
    draws = [row[0] for row in _draws(logits, seq, None, _free(1), 4000)]
    assert set(draws) == {1, 3, 4}
    for token, share in ((1, 0.4 / 0.85), (3, 0.3 / 0.85), (4, 0.15 / 0.85)):
        assert abs(draws.count(token) / len(draws) - share) < 0.03


def test_top_k_candidates_include_ties_and_exclude_masked_ids():
    logits = torch.tensor([[[1.0, 2.0, 2.0, 0.0, 5.0]]])
    masks = torch.tensor([[[True, True, True, True, False]]])  # the best id is not allowed
    seq = _seq(SamplingParams(temperature=1.0, top_k=2), seed=3)
    seen = {row[0] for row in _draws(logits, seq, masks, [(0, None)], 300)}
    assert seen == {1, 2}  # both ids tied at the 2nd best value of the allowed ones
    few = _seq(SamplingParams(temperature=1.0, top_k=50), seed=4)  # k above the allowed count
    seen = {row[0] for row in _draws(logits, few, masks, [(0, None)], 300)}
    assert seen == {0, 1, 2, 3}


def test_min_p_limits_the_thresholded_draw():
    logits = torch.log(torch.tensor([[[0.5, 0.3, 0.15, 0.05]]]))
    seq = _seq(SamplingParams(temperature=1.0, top_k=0, min_p=0.2), seed=5)
    seen = {row[0] for row in _draws(logits, seq, None, _free(1), 400)}
    assert seen == {0, 1, 2}  # 0.05 is below 0.2 x 0.5


def test_mixed_batches_draw_each_sequence_as_it_would_alone():
    torch.manual_seed(3)
    logits = torch.randn(3, 2, 60)
    nucleus = SamplingParams(temperature=1.0, top_k=30, top_p=0.9, seed=21)
    plain = SamplingParams(temperature=0.8, top_k=40, seed=22)
    alone = [
        sample_rows(logits[i : i + 1], [_seq(p)], None, _free(1))[0]
        for i, p in ((0, nucleus), (1, plain))
    ]
    batched = sample_rows(logits, [_seq(nucleus), _seq(plain), _seq(GREEDY)], None, _free(3))
    assert batched[:2] == alone
    assert batched[2] == logits[2].argmax(-1).tolist()


@pytest.mark.parametrize(
    ("masks_shape", "ban_share"),
    [((1, 8, 1026), 0.002), ((1, 8, 1026), 0.5), ((3, 8, 1026), 0.002), ((1, 2, 5), 0.2)],
)
def test_excluded_ids_are_minus_infinity_and_nothing_else_changes(
    masks_shape: tuple[int, int, int], ban_share: float
) -> None:
    generator = torch.Generator().manual_seed(0)
    allowed = torch.rand(masks_shape, generator=generator) >= ban_share
    base = torch.randn(3, masks_shape[1], masks_shape[2] + 1, generator=generator)
    logits = base[..., :-1]  # not contiguous: the fill must not assume it
    plan = SamplingMasks(allowed, "cpu").plan([0, 0, 0] if masks_shape[0] == 1 else [0, 1, 2])
    assert plan.columns is None  # (masks allowing most ids: the whole vocabulary stays)
    out = _exclude(logits, plan)
    assert torch.equal(out, logits.masked_fill(~allowed, float("-inf")))
    assert torch.equal(logits, base[..., :-1]) and out.data_ptr() != logits.data_ptr()


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=1.0, top_k=0, top_p=0.8, seed=3),  # ranked (Orpheus' default)
        SamplingParams(temperature=1.0, top_k=5, seed=3),  # thresholded
        GREEDY,
    ],
)
def test_a_row_of_nan_or_of_no_candidate_still_gives_ids_in_range(params):
    """Rows are sampled before anyone knows they held NaN (the runner reads the flags with
    the ids): such a row's ids must index nothing out of range, and the others draw as alone."""
    torch.manual_seed(4)
    logits = torch.randn(3, 2, 12)
    logits[1] = float("nan")
    logits[2, 0] = float("-inf")
    columns = torch.arange(100, 112)
    masks = torch.ones(1, 2, 200, dtype=torch.bool)
    seqs = [_seq(params), _seq(params, seed=1), _seq(params, seed=2)]
    ids = sample_ids(logits, seqs, masks, _free(3), columns=columns)
    assert bool(((ids >= 100) & (ids < 112)).all())
    alone = sample_ids(logits[:1], seqs[:1], masks, _free(1), columns=columns)
    assert torch.equal(ids[:1], alone)
