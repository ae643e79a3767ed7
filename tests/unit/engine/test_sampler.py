import pytest
import torch

from cadenza.engine.sampler import sample_row
from cadenza.engine.sampling_params import SamplingParams


def _gen(seed=0):
    return torch.Generator().manual_seed(seed)


def test_greedy_takes_the_best_allowed_id():
    logits = torch.tensor([[0.0, 5.0, 1.0], [3.0, 0.0, 1.0]])
    allowed = torch.tensor([[True, False, True], [True, True, True]])
    row = sample_row(logits, allowed, [None, None], SamplingParams(temperature=0), _gen())
    assert row == [2, 0]


def test_forced_ids_win():
    logits = torch.zeros(2, 4)
    allowed = torch.ones(2, 4, dtype=torch.bool)
    row = sample_row(logits, allowed, [None, 3], SamplingParams(temperature=0), _gen())
    assert row[1] == 3


def test_same_seed_same_draws_and_top_k_limits_choice():
    torch.manual_seed(123)
    logits = torch.randn(4, 50)
    allowed = torch.ones(4, 50, dtype=torch.bool)
    params = SamplingParams(temperature=1.0, top_k=3)
    first = [sample_row(logits, allowed, [None] * 4, params, _gen(7)) for _ in range(3)]
    assert first[0] == first[1] == first[2]
    top3 = torch.topk(logits, 3, dim=-1).indices
    draws = _gen(1)
    for _ in range(50):
        row = sample_row(logits, allowed, [None] * 4, params, draws)
        assert all(row[k] in top3[k].tolist() for k in range(4))


def test_top_p_keeps_the_nucleus():
    logits = torch.log(torch.tensor([[0.6, 0.3, 0.05, 0.05]]))
    allowed = torch.ones(1, 4, dtype=torch.bool)
    params = SamplingParams(temperature=1.0, top_k=0, top_p=0.8)
    draws = _gen(0)
    seen = {sample_row(logits, allowed, [None], params, draws)[0] for _ in range(200)}
    assert seen == {0, 1}


@pytest.mark.parametrize(
    "kwargs", [{"temperature": -1}, {"top_k": -1}, {"top_p": 0}, {"top_p": 1.5}]
)
def test_invalid_params(kwargs):
    with pytest.raises(ValueError):
        SamplingParams(**kwargs)
