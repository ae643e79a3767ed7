"""The native thresholded draw against the sampler's torch path: the same ids for the same
uniforms, over temperatures, top-k up to the whole vocabulary, min-p, masked ids and ties (at
every instruction-set level, ``isa_level``); garbage arguments refused."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from cadenza.contract.sampling import SamplingParams
from cadenza.engine import sampler
from cadenza.kernels import cpu_sampling

needs_kernel = pytest.mark.skipif(
    not cpu_sampling.available(), reason="no C++ compiler on this machine"
)


def _sequences(settings: list[SamplingParams]) -> list[SimpleNamespace]:
    return [SimpleNamespace(sampling=s) for s in settings]


def _draw(logits, settings, uniform, native: bool, monkeypatch) -> torch.Tensor:
    monkeypatch.setattr(cpu_sampling, "available", lambda: native)
    return sampler._draw_thresholded(_sequences(settings), logits.clone(), uniform)


@pytest.mark.parametrize("vocab", [1026, 37])
def test_native_draws_the_ids_the_torch_path_draws(vocab, monkeypatch, isa_level):
    generator = torch.Generator().manual_seed(vocab)
    settings = [
        SamplingParams(),
        SamplingParams(temperature=0.7, top_k=5),
        SamplingParams(temperature=1.3, top_k=0),  # the whole vocabulary
        SamplingParams(top_k=1),
        SamplingParams(temperature=0.9, top_k=40, min_p=0.05),
        SamplingParams(top_k=vocab + 10),
    ]
    for trial in range(20):
        logits = torch.randn(len(settings), 8, vocab, generator=generator) * (1 + trial % 4)
        logits[1, :, : vocab // 2] = float("-inf")  # a mask leaving fewer ids than top_k
        logits[2, 3] = 0.5  # a row of ties
        logits[4, :, ::3] = logits[4, :, :1]  # ties at the threshold
        uniform = torch.rand(len(settings), 8, generator=generator)
        native = _draw(logits, settings, uniform, True, monkeypatch)
        reference = _draw(logits, settings, uniform, False, monkeypatch)
        assert torch.equal(native, reference), trial
        assert bool((logits.gather(-1, native[..., None]) > float("-inf")).all())


@needs_kernel
def test_garbage_arguments_are_refused():
    logits = torch.randn(2, 3, 10)
    uniform = torch.rand(2, 3)
    good = ([1.0, 1.0], [5, 5], [0.0, 0.0])
    with pytest.raises(ValueError, match="per sequence"):
        cpu_sampling.draw_thresholded(logits, [1.0], [5], [0.0], uniform)
    with pytest.raises(ValueError, match="uniform"):
        cpu_sampling.draw_thresholded(logits, *good, torch.rand(3, 2))
    with pytest.raises(ValueError, match="top_k"):
        cpu_sampling.draw_thresholded(logits, [1.0, 1.0], [0, 5], [0.0, 0.0], uniform)
    with pytest.raises(ValueError, match="temperature"):
        cpu_sampling.draw_thresholded(logits, [0.0, 1.0], [5, 5], [0.0, 0.0], uniform)
    ids = cpu_sampling.draw_thresholded(logits, *good, uniform)
    assert ids.shape == (2, 3) and ids.dtype == torch.int64


@needs_kernel
def test_a_row_of_nan_still_gives_an_id_in_range():
    logits = torch.full((1, 2, 10), float("nan"))
    ids = cpu_sampling.draw_thresholded(logits, [1.0], [3], [0.0], torch.rand(1, 2))
    assert bool(((ids >= 0) & (ids < 10)).all())


def test_without_the_kernel_draw_refuses_and_the_sampler_uses_torch(monkeypatch):
    monkeypatch.setattr(cpu_sampling, "_native", lambda: None)
    assert not cpu_sampling.available()
    with pytest.raises(RuntimeError, match="not built"):
        cpu_sampling.draw_thresholded(torch.zeros(1, 1, 4), [1.0], [1], [0.0], torch.rand(1, 1))
    ids = sampler._draw_thresholded(
        _sequences([SamplingParams()]), torch.randn(1, 8, 20), torch.rand(1, 8)
    )
    assert ids.shape == (1, 8)
