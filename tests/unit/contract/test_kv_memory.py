"""KV arithmetic: the one formula for bytes per token and pages per stream."""

from __future__ import annotations

import pytest

from cadenza.contract.kv_memory import (
    KV_DTYPE_BYTES,
    StreamShape,
    kv_bytes_per_token,
    pages_for_tokens,
)


def test_llama3_8b_bf16_is_128_kib_per_token() -> None:
    assert kv_bytes_per_token(32, 8, 128, "bf16") == 131_072
    assert kv_bytes_per_token(28, 8, 128, "bf16") == 114_688  # Orpheus 3B


def test_int8_counts_its_float16_scales() -> None:
    assert kv_bytes_per_token(8, 2, 64, "int8") == 2 * 8 * 2 * 64 + 2 * 8 * 2 * 2
    with pytest.raises(KeyError):
        kv_bytes_per_token(8, 2, 64, "fp4")
    assert set(KV_DTYPE_BYTES) >= {"fp32", "fp16", "bf16", "int8"}


def test_pages() -> None:
    assert [pages_for_tokens(n, 16) for n in (0, 1, 16, 17, 32)] == [0, 1, 1, 2, 2]


def test_a_stream_shape_costs_prompt_and_output() -> None:
    shape = StreamShape(page_size=16, steps_per_frame=1, tail_steps=7, prompt_overhead_tokens=2)
    assert shape.max_prompt_tokens("abc") == 5
    assert shape.max_prompt_tokens("é") == 4  # two UTF-8 bytes
    assert shape.max_prompt_tokens("abc", prompt_audio_frames=10) == 15
    assert shape.pages(5, 150) == pages_for_tokens(5 + 157, 16) == 11
    assert shape.nominal_prompt_tokens == 64 + 2  # the nominal stream's 64 characters
