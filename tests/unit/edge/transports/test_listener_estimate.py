"""The server's estimate of what a WebSocket listener hears (``done.stats``)."""

from __future__ import annotations

import json

from cadenza.edge.transports.listener_estimate import ListenerEstimate


def stats(estimate: ListenerEstimate) -> dict:
    return json.loads(estimate.done_message(1, "eos"))["stats"]


def test_chunks_in_time_are_no_underrun_and_a_late_one_is_one_by_how_late():
    estimate = ListenerEstimate()
    estimate.sent(0.2, 0.1)  # first audio at 0.1 s: plays until 0.3
    estimate.sent(0.2, 0.25)
    estimate.sent(0.2, 0.55)  # due at 0.5
    result = stats(estimate)
    assert result["ttfa_ms"] == 100.0 and result["chunks"] == 3
    assert result["underruns"] == 1 and result["longest_underrun_ms"] == 50.0
    assert "segments" not in result


def test_silence_while_a_text_stream_waits_for_text_is_text_wait_not_underrun():
    estimate = ListenerEstimate()
    estimate.segment_started(0.0)
    estimate.sent(1.0, 0.1)  # plays until 1.1
    estimate.waiting_for_text()
    estimate.segment_started(2.0)  # the text came after the listener ran dry
    estimate.sent(0.5, 2.3)  # its first audio: 1.2 s of silence, the text's
    estimate.sent(0.5, 2.5)
    result = stats(estimate)
    assert result["underruns"] == 0 and result["text_wait_ms"] == 1200
    assert result["segments"] == 2 and result["ttfa_ms"] == 100.0


def test_text_that_came_in_time_leaves_a_late_segment_an_underrun():
    estimate = ListenerEstimate()
    estimate.segment_started(0.0)
    estimate.sent(1.0, 0.1)  # plays until 1.1
    estimate.waiting_for_text()
    estimate.segment_started(0.5)  # the text came while the listener still had audio
    estimate.sent(0.5, 1.4)  # 0.3 s late: the server's gap
    result = stats(estimate)
    assert result["underruns"] == 1 and result["longest_underrun_ms"] == 300.0
    assert result["text_wait_ms"] == 0
