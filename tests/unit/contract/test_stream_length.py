"""A stream's length: from its text, capped by itself and by the server, in frames and steps."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cadenza.config import LimitsConfig
from cadenza.contract.kv_memory import StreamShape
from cadenza.contract.stream_length import (
    NOMINAL_TEXT,
    StreamLength,
    derive_duration_s,
    frames_for_duration,
    request_duration_s,
    steps_for_frames,
    stream_length,
)

SNAC_RATE = 24000 / 2048  # 11.7 frames a second


def test_duration_follows_the_text_within_the_caps() -> None:
    kwargs = {"chars_per_second": 14.0, "min_duration_s": 1.0, "server_max_duration_s": 30.0}
    assert derive_duration_s("x" * 28, None, **kwargs) == 2.0
    assert derive_duration_s("x", None, **kwargs) == 1.0
    assert derive_duration_s("x" * 1400, None, **kwargs) == 30.0
    assert derive_duration_s("x" * 1400, 5.0, **kwargs) == 5.0
    assert derive_duration_s("x", 0.25, **kwargs) == 0.25
    assert derive_duration_s("x" * 1400, 60.0, **kwargs) == 30.0


def test_the_server_limits_apply_and_frames_round_to_the_nearest() -> None:
    limits = LimitsConfig(chars_per_second=10.0, max_duration_s=4.0)
    assert request_duration_s("x" * 25, None, limits) == 2.5
    assert request_duration_s("x" * 100, None, limits) == 4.0
    assert frames_for_duration(2.5, 75.0) == 188
    assert frames_for_duration(0.001, 75.0) == 0
    assert frames_for_duration(2048 / 24000 * 3, SNAC_RATE) == 3


def test_steps_per_frame_and_the_delay_tail() -> None:
    assert steps_for_frames(0, 1, 7) == 0  # no frames, no delay tail either
    assert steps_for_frames(10, 1, 7) == 17  # parallel + delay
    assert steps_for_frames(10, 7, 0) == 70  # flat, 7 tokens per frame


@pytest.mark.parametrize(
    ("duration_s", "frame_rate", "steps_per_frame", "tail_steps", "expected"),
    [
        (2.0, 75.0, 1, 7, StreamLength(150, 157)),  # cadenza-tiny: EnCodec, delay pattern
        (2.0, SNAC_RATE, 7, 0, StreamLength(23, 161)),  # Orpheus: SNAC, 7 tokens a frame
        (2.0, 12.5, 1, 0, StreamLength(25, 25)),  # CSM: Mimi, a frame a step
        (0.001, 75.0, 1, 7, StreamLength(0, 0)),  # no frame: no steps, no tail
    ],
)
def test_a_duration_is_frames_and_the_steps_that_make_them(
    duration_s: float, frame_rate: float, steps_per_frame: int, tail_steps: int, expected
) -> None:
    shape = StreamShape(16, steps_per_frame, tail_steps, prompt_overhead_tokens=0)
    assert stream_length(duration_s, frame_rate, shape) == expected


@given(
    st.floats(0.0, 600.0),
    st.sampled_from([75.0, SNAC_RATE, 12.5]),
    st.integers(1, 8),
    st.integers(0, 8),
)
def test_the_length_is_what_the_kv_reservation_costs(
    duration_s: float, frame_rate: float, steps_per_frame: int, tail_steps: int
) -> None:
    shape = StreamShape(16, steps_per_frame, tail_steps, prompt_overhead_tokens=3)
    length = stream_length(duration_s, frame_rate, shape)
    assert length.frames == frames_for_duration(duration_s, frame_rate)
    assert length.steps == shape.steps_for_frames(length.frames)
    assert shape.pages(10, length.frames) == -(-(10 + length.steps) // 16)


def test_the_nominal_stream_has_64_characters() -> None:
    assert NOMINAL_TEXT == "x" * 64
