"""Each stream's uniforms: a function of its seed, its rows drawn and the codebook, strictly
inside (0, 1), uniform enough to sample from, the same in any batch, and advanced by the rows
a stream holds (so a resumed stream draws on as it would have)."""

from __future__ import annotations

import torch

from cadenza.contract.sampling import SamplingParams
from cadenza.engine.sampler import sample_rows
from cadenza.engine.sequence import Sequence
from cadenza.engine.stream_draws import _mul32, draw_keys, stream_uniforms, uniforms

CPU = torch.device("cpu")


def _seq(seed: int, rows_drawn: int = 0) -> Sequence:
    seq = Sequence("s", [[0]], SamplingParams(seed=seed), torch.Generator().manual_seed(seed), 9)
    seq.rows_drawn = rows_drawn
    return seq


def test_a_draw_is_its_seed_row_and_codebook_whatever_the_batch() -> None:
    a, b, c = _seq(1), _seq(2), _seq(1, rows_drawn=5)
    batch = uniforms(draw_keys([a, b, c], CPU), 0, 4)
    assert torch.equal(uniforms(draw_keys([b], CPU), 0, 4)[0], batch[1])
    assert torch.equal(uniforms(draw_keys([c, a], CPU), 0, 4), batch[[2, 0]])
    assert not torch.equal(batch[0], batch[1]) and not torch.equal(batch[0], batch[2])
    # A part of a row (a depth decoder's level) draws that codebook's uniform.
    assert torch.equal(uniforms(draw_keys([a], CPU), 2, 1)[0, 0], batch[0, 2])


def test_uniforms_lie_strictly_inside_zero_one_and_spread_evenly() -> None:
    seqs = [_seq(seed, rows) for seed in range(40) for rows in range(50)]
    values = uniforms(draw_keys(seqs, CPU), 0, 8).flatten()
    assert bool((values > 0).all()) and bool((values < 1).all())
    assert abs(values.mean().item() - 0.5) < 0.01
    counts = torch.histc(values, bins=10, min=0.0, max=1.0)
    assert bool((abs(counts / values.numel() - 0.1) < 0.01).all())
    assert values.unique().numel() > 0.99 * values.numel()


def test_large_and_zero_seeds_hash_like_any_other() -> None:
    seeds = [0, 1, 2**32 - 1, 2**32, 2**62 + 12345, 2**63 - 1]
    values = uniforms(draw_keys([_seq(seed) for seed in seeds], CPU), 0, 2)
    assert values.unique().numel() == values.numel()


def test_products_wrap_at_32_bits_without_overflow() -> None:
    h = torch.tensor([0, 1, 0xFFFFFFFF, 0x12345678, 0xDEADBEEF])
    for constant in (0x85EBCA6B, 0xC2B2AE35):
        expected = [(int(v) * constant) % 2**32 for v in h]
        assert _mul32(h, constant).tolist() == expected


def test_a_stream_that_appended_rows_draws_on_as_if_it_had_drawn_them() -> None:
    logits = torch.randn(1, 2, 30)
    first = _seq(7)
    lived = []
    for _ in range(6):
        row = sample_rows(logits, [first], None, [(0, None)])[0]
        first.append(row)
        lived.append(row)
    resumed = _seq(7)
    for row in lived[:3]:  # resumed after three rows: appended, not drawn
        resumed.append(row)
    again = []
    for _ in range(3):
        row = sample_rows(logits, [resumed], None, [(0, None)])[0]
        resumed.append(row)
        again.append(row)
    assert again == lived[3:] and resumed.rows_drawn == 6


def test_the_cpu_s_numpy_hash_equals_the_device_s_torch_hash() -> None:
    seqs = [_seq(seed, rows) for seed in (0, 5, 2**40 + 3, 2**63 - 1) for rows in (0, 1, 2**20)]
    on_host = stream_uniforms(seqs, 3, 5, CPU)
    in_torch = uniforms(draw_keys(seqs, CPU), 3, 5)
    assert on_host.dtype == torch.float32 and on_host.shape == (12, 5)
    assert torch.equal(on_host, in_torch)
