"""Bark's causal stage: chunked prefill and batched decoding equal one whole pass; KV slots."""

from __future__ import annotations

import pytest
import torch

from cadenza.engine.models.bark.bark_gpt import BarkCausalGPT, GPTShape, StageKV

SHAPE = GPTShape(32, 2, 2, 64, 50, 40, bias=True)


def _logits_per_prefix(model: BarkCausalGPT, embeds: torch.Tensor, chunk: int) -> torch.Tensor:
    kv = StageKV(SHAPE, 64, torch.device("cpu"), torch.float32)
    slot = torch.tensor([kv.take()])
    out = []
    for start in range(0, embeds.shape[0], chunk):
        piece = embeds[start : start + chunk]
        out.append(model(piece[None], slot, torch.tensor([start]), kv))
    return torch.cat(out)


def test_chunks_and_batches_give_the_same_logits() -> None:
    torch.manual_seed(0)
    model = BarkCausalGPT(SHAPE).eval()
    embeds = torch.randn(12, 32)
    with torch.no_grad():
        whole = _logits_per_prefix(model, embeds, 12)
        by_one = _logits_per_prefix(model, embeds, 1)
        torch.testing.assert_close(by_one[-1], whole[0], rtol=1e-5, atol=1e-5)
        # Two streams at different positions in one decode step.
        kv = StageKV(SHAPE, 64, torch.device("cpu"), torch.float32)
        a, b = kv.take(), kv.take()
        model(embeds[None, :7], torch.tensor([a]), torch.tensor([0]), kv)
        model(embeds[None, :3], torch.tensor([b]), torch.tensor([0]), kv)
        step = model(
            torch.stack([embeds[7:8], embeds[3:4]]), torch.tensor([a, b]), torch.tensor([7, 3]), kv
        )
        alone = _logits_per_prefix(model, embeds[:8], 8)
        torch.testing.assert_close(step[0], alone[0], rtol=1e-5, atol=1e-5)


def test_slots_are_handed_out_grown_and_given_back() -> None:
    kv = StageKV(SHAPE, 16, torch.device("cpu"), torch.float32)
    slots = [kv.take() for _ in range(3)]
    assert slots == [0, 1, 2] and kv.num_slots == 4 and kv.slots_in_use == 3
    kv.give_back(1)
    assert kv.take() == 3 and kv.take() == 1
    with pytest.raises(ValueError, match="not in use"):
        kv.give_back(9)
    model = BarkCausalGPT(SHAPE)
    with pytest.raises(ValueError, match="past the stage's window"):
        model(torch.zeros(1, 2, 32), torch.tensor([0]), torch.tensor([15]), kv)
