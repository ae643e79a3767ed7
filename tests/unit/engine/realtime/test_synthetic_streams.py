"""The synthetic streams calibration and probes run: distinct prompts (no prefix-cache hit),
long enough to measure, and a fit check against the KV pages."""

from __future__ import annotations

from cadenza.engine.realtime.synthetic_streams import (
    SHORT_PROMPT_CHARS,
    steps_to_measure,
    synthetic_request,
    synthetic_streams_fit,
)


def test_each_request_is_distinct_and_long_enough(tiny_engine) -> None:
    first = synthetic_request(tiny_engine, SHORT_PROMPT_CHARS, "probe")
    second = synthetic_request(tiny_engine, SHORT_PROMPT_CHARS, "probe")
    assert first.request_id.startswith("probe-") and first.request_id != second.request_id
    assert len(first.text) == SHORT_PROMPT_CHARS
    assert first.max_duration_s is not None
    frames = first.max_duration_s * tiny_engine.frame_rate
    assert frames >= steps_to_measure(tiny_engine)  # one step a frame for cadenza-tiny


def test_streams_fit_by_pages_slots_and_text_limits(tiny_engine) -> None:
    assert synthetic_streams_fit(tiny_engine, 1, SHORT_PROMPT_CHARS)
    assert not synthetic_streams_fit(tiny_engine, 10**6, SHORT_PROMPT_CHARS)
    too_long = tiny_engine.config.limits.max_input_chars + 1
    assert not synthetic_streams_fit(tiny_engine, 1, too_long)
