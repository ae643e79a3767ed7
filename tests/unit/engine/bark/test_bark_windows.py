"""Bark's windowing as pure functions: the numbers ``transformers`` computes."""

from __future__ import annotations

import pytest
import torch

from cadenza.engine.models.bark.bark_constants import BarkConstants
from cadenza.engine.models.bark.bark_voices import VoicePreset
from cadenza.engine.models.bark.bark_windows import (
    coarse_allowed,
    coarse_codes,
    coarse_history,
    coarse_tokens_for,
    coarse_window_prompt,
    fine_windows,
    semantic_prompt,
)

C = BarkConstants()


def _voice(frames: int, semantic: int) -> VoicePreset:
    return VoicePreset(
        torch.arange(semantic),
        torch.ones(2, frames, dtype=torch.int64),
        torch.zeros(8, frames, dtype=torch.int64),
    )


def test_the_semantic_prompt_shifts_and_pads() -> None:
    text, history = semantic_prompt([5, 6], _voice(10, 300), C)
    assert text[:3].tolist() == [10_053, 10_054, 129_595] and text.shape == (256,)
    assert history[0] == 44 and history[-1] == 299  # the last 256 of 300
    _, none = semantic_prompt([5], None, C)
    assert set(none.tolist()) == {10_000}


def test_the_coarse_history_interleaves_and_drops_two() -> None:
    history = coarse_history(_voice(450, 300), C)
    assert len(history.semantic) == 209  # floor(630 / ratio)
    assert len(history.coarse) == round(209 * C.semantic_to_coarse_ratio) - 2
    assert history.coarse[:2] == [10_001, 11_025]  # codebook 0 then codebook 1, offset
    assert coarse_history(None, C).coarse == []


def test_coarse_windows() -> None:
    assert coarse_tokens_for(400, C) == 2 * 601
    prompt = coarse_window_prompt(list(range(10)), 4, [11] * 700, 0, C)
    assert len(prompt) == 256 + 1 + 630 and prompt[256] == 12_050
    assert prompt[:10] == list(range(10)) and prompt[10] == 12_048
    assert coarse_allowed(0, C, 12_096) == (10_000, 11_024)
    assert coarse_allowed(1, C, 12_096) == (11_024, 12_096)
    assert coarse_codes([10_005, 11_030], C).tolist() == [[5, 6]]


def test_fine_windows_are_laid_out_from_the_frame_count() -> None:
    short = fine_windows(100, _voice(450, 10), C)
    assert short.windows == [(0, 450)] and short.buffer.shape == (1024, 8)
    assert short.final_after(0) == 100
    long = fine_windows(700, _voice(450, 10), C)
    assert long.buffer.shape == (1150, 8)
    assert long.windows == [(0, 450), (126, 638)]
    assert not long.ready(0, 1024)
    long.put_coarse(torch.full((574, 2), 7))  # up to the first window's end
    assert long.ready(0, 1024) and not long.ready(1, 1024)
    assert long.final_after(0) == 638 - 450  # the second window rewrites from there
    long.put_coarse(torch.full((126, 2), 7))
    assert long.ready(1, 1024) and long.final_after(1) == 700
    assert long.codes.shape == (8, 700) and (long.codes[:2] == 7).all()
    assert (long.buffer[450:, 2:] == 1024).all()  # unset until a window fills them
    with pytest.raises(ValueError, match="more coarse frames"):
        long.put_coarse(torch.zeros(1, 2, dtype=torch.int64))
    assert fine_windows(0, None, C).windows == [(0, 0)]
