"""A request's length: from its text, capped by itself and by the server, in frames."""

from __future__ import annotations

from cadenza.config import LimitsConfig
from cadenza.contract.stream_length import (
    derive_duration_s,
    frames_for_duration,
    request_duration_s,
)


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
    assert frames_for_duration(2048 / 24000 * 3, 24000 / 2048) == 3
