"""Streaming Mimi encode equals offline encode for any split of the audio, a partial last frame
included (flushed at finish), and each complete frame's codes come out as soon as it is in."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from cadenza.codecs import CodecError
from cadenza.codecs.mimi import MimiCodec
from cadenza.codecs.mimi_streaming_encoder import MimiStreamingEncoder
from tests.unit.codecs.test_mimi import HOP, tiny_mimi_codec


@pytest.fixture(scope="module")
def codec() -> MimiCodec:
    return tiny_mimi_codec()


def _audio(samples: int, seed: int) -> torch.Tensor:
    return 0.3 * torch.randn(samples, generator=torch.Generator().manual_seed(seed))


def _pieces(total: int, plan: str, rng: random.Random) -> list[int]:
    if plan == "whole":
        return [total]
    if plan == "frames":
        return [HOP] * (total // HOP) + ([total % HOP] if total % HOP else [])
    sizes, left = [], total
    while left > 0:  # tiny pieces at first, then up to a few frames
        size = rng.randint(0, 7) if len(sizes) < 20 else rng.randint(0, 3 * HOP)
        sizes.append(min(size, left))
        left -= sizes[-1]
    return sizes


@pytest.mark.parametrize("plan", ["whole", "frames", "random"])
@pytest.mark.parametrize("samples", [8 * HOP, 8 * HOP + 5, 6 * HOP - 700, 3])
def test_streaming_encode_equals_offline(codec, plan, samples) -> None:
    audio = _audio(samples, seed=samples)
    expected = codec.encode(audio[None])[0]
    assert len(set(expected.flatten().tolist())) > 1  # the codes vary: a real comparison
    encoder = MimiStreamingEncoder(codec)
    rng = random.Random(samples)
    fed, out = 0, []
    for size in _pieces(samples, plan, rng):
        codes = encoder.feed(audio[fed : fed + size])
        fed += size
        assert codes.shape == (8, encoder.frames_out - sum(c.shape[1] for c in out))
        assert encoder.frames_out == fed // HOP  # every complete frame, no more
        out.append(codes)
    tail = encoder.finish()
    assert tail.shape[1] == (1 if samples % HOP else 0)
    assert torch.equal(torch.cat([*out, tail], dim=1), expected)


def test_the_encoder_is_reusable_after_finish(codec) -> None:
    encoder = MimiStreamingEncoder(codec)
    encoder.feed(_audio(3 * HOP + 11, seed=1).numpy())
    encoder.finish()
    audio = _audio(5 * HOP, seed=2)
    codes = torch.cat([encoder.feed(audio[: 2 * HOP - 3]), encoder.feed(audio[2 * HOP - 3 :])], 1)
    assert torch.equal(codes, codec.encode(audio[None])[0])
    encoder.reset()
    assert encoder.finish().shape == (8, 0)  # an empty stream has no codes


def test_bad_audio_is_refused(codec) -> None:
    encoder = MimiStreamingEncoder(codec)
    for bad in (
        np.zeros((2, 10), np.float32),
        torch.zeros(1, 10),
        torch.zeros(10, dtype=torch.int),
    ):
        with pytest.raises(CodecError):
            encoder.feed(bad)
    assert encoder.samples_fed == 0
