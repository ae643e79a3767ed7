"""A depth decoder's scratch KV: feeding a frame's positions a few at a time gives the hidden
states of feeding them all at once, for every row of the batch; the cache grows with the batch;
a position past the frame is refused."""

from __future__ import annotations

import pytest
import torch

from cadenza.engine.models.depth_scratch import DepthScratch
from cadenza.engine.models.llama import LlamaBackbone, LlamaBackboneConfig

CONFIG = LlamaBackboneConfig(
    hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=8, intermediate_size=48
)


def _run(model: LlamaBackbone, scratch: DepthScratch, x: torch.Tensor, rows: int, start: int):
    count = x.shape[0] // rows
    cache = scratch.cache_for(rows, x.dtype, x.device)
    context = scratch.context(rows, start, count, x.device)
    return model(x, scratch.positions_of(rows, start, count, x.device), context, cache)


@torch.no_grad()
def test_positions_fed_in_steps_equal_positions_fed_at_once() -> None:
    torch.manual_seed(0)
    model = LlamaBackbone(CONFIG).eval()
    rows, positions = 3, 6
    x = torch.randn(positions, rows, 32)  # position-major
    whole = _run(model, DepthScratch(CONFIG.kv_spec, positions), x.reshape(-1, 32), rows, 0)
    scratch = DepthScratch(CONFIG.kv_spec, positions)
    pieces = [_run(model, scratch, x[:2].reshape(-1, 32), rows, 0)]
    pieces += [_run(model, scratch, x[p], rows, p) for p in range(2, positions)]
    torch.testing.assert_close(torch.cat(pieces), whole, atol=1e-5, rtol=1e-5)
    # a second frame overwrites the first: the same inputs give the same states
    again = [_run(model, scratch, x[:2].reshape(-1, 32), rows, 0)]
    torch.testing.assert_close(again[0], pieces[0])


def test_the_cache_grows_with_the_batch_and_refuses_positions_past_the_frame() -> None:
    scratch = DepthScratch(CONFIG.kv_spec, positions=4)
    small = scratch.cache_for(2, torch.float32, torch.device("cpu"))
    assert (
        small.num_pages >= 2 and scratch.cache_for(2, torch.float32, torch.device("cpu")) is small
    )
    large = scratch.cache_for(small.num_pages + 1, torch.float32, torch.device("cpu"))
    assert large.num_pages > small.num_pages and large.page_size == 4
    with pytest.raises(ValueError, match="past the frame"):
        scratch.context(2, 3, 2, torch.device("cpu"))
