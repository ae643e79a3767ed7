"""Audio chunking policy: chunk sizes in a codec's frames; when streams are due, first vs later
chunks, finished streams, joiners."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from cadenza.config import CadenzaConfig, RealtimeConfig
from cadenza.contract.sampling import SamplingParams
from cadenza.engine.chunk_policy import (
    CodecFrames,
    codec_chunk_frames,
    config_in_codec_frames,
    streams_to_decode,
)
from cadenza.engine.realtime.playout_clock import PlayoutClock
from cadenza.engine.sequence import AudioProgress, Sequence

FIRST, CHUNK = 4, 15  # joiners need CHUNK // 3 = 5 frames
SNAC_RATE = 24000 / 2048  # SNAC 24 kHz: 11.7 frames a second


def stream(name: str, frames_sent: int = 0) -> Sequence:
    seq = Sequence(name, [[0]], SamplingParams(), torch.Generator(), 100)
    seq.audio = AudioProgress(PlayoutClock(0.0, 0.3, 1 / 75, 0.1), 0, frames_sent)
    return seq


def decide(pending: dict[Sequence, int], finished=()) -> list[str]:
    chosen = streams_to_decode(pending, finished, first_chunk_frames=FIRST, chunk_frames=CHUNK)
    return [seq.request_id for seq in chosen]


def test_nothing_decodes_until_some_stream_is_due() -> None:
    fresh, sent = stream("fresh"), stream("sent", frames_sent=4)
    assert decide({fresh: FIRST - 1, sent: CHUNK - 1}) == []
    assert decide({}) == []


def test_a_new_stream_is_due_at_the_first_chunk_size() -> None:
    assert decide({stream("a"): FIRST - 1}) == []
    assert decide({stream("a"): FIRST}) == ["a"]


def test_later_chunks_are_due_at_the_chunk_size() -> None:
    assert decide({stream("a", frames_sent=FIRST): FIRST}) == []  # the first size is past
    assert decide({stream("a", frames_sent=FIRST): CHUNK - 1}) == []
    assert decide({stream("a", frames_sent=FIRST): CHUNK}) == ["a"]
    assert decide({stream("a", frames_sent=FIRST): CHUNK + 7}) == ["a"]


def test_a_finished_stream_always_decodes_even_with_nothing_pending() -> None:
    done = stream("done", frames_sent=30)
    waiting = stream("waiting", frames_sent=30)
    assert decide({done: 0, waiting: 1}, finished={done}) == ["done"]
    assert decide({stream("short"): 2}, finished=set()) == []
    short = stream("short")
    assert decide({short: 2}, finished={short}) == ["short"]


def test_streams_a_third_of_the_way_join_a_due_decode() -> None:
    due = stream("due", frames_sent=FIRST)
    joiner = stream("joiner", frames_sent=FIRST)
    behind = stream("behind", frames_sent=FIRST)
    pending = {due: CHUNK, joiner: CHUNK // 3, behind: CHUNK // 3 - 1}
    assert decide(pending) == ["due", "joiner"]


def test_nobody_joins_when_nothing_is_due() -> None:
    assert decide({stream("a", FIRST): CHUNK - 1, stream("b", FIRST): CHUNK - 1}) == []


def test_only_streams_that_already_sent_frames_join() -> None:
    due = stream("due", frames_sent=FIRST)
    fresh = stream("fresh")  # its first chunk is not due yet: it may not join
    assert decide({due: CHUNK, fresh: FIRST - 1}) == ["due"]
    fresh_with_room = stream("fresh")
    assert decide({due: CHUNK, fresh_with_room: FIRST}) == ["due", "fresh"]  # due itself


def test_a_finished_stream_makes_the_others_join_too() -> None:
    done = stream("done", frames_sent=30)
    joiner = stream("joiner", frames_sent=FIRST)
    assert decide({joiner: CHUNK // 3, done: 0}, finished={done}) == ["joiner", "done"]


def test_the_join_threshold_is_at_least_one_frame() -> None:
    due, idle = stream("due", frames_sent=1), stream("idle", frames_sent=1)
    chosen = streams_to_decode(
        {due: 2, idle: 0}, (), first_chunk_frames=1, chunk_frames=2
    )  # 2 // 3 == 0, but a stream with nothing pending never joins
    assert chosen == [due]


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 40), st.integers(0, 40), st.booleans()), max_size=8),
    st.integers(1, 10),
    st.integers(1, 30),
)
def test_the_choice_follows_the_rules(entries, first, chunk) -> None:
    seqs = [stream(f"s{i}", frames_sent=sent) for i, (sent, _, _) in enumerate(entries)]
    pending = {seq: frames for seq, (_, frames, _) in zip(seqs, entries, strict=True)}
    finished = {seq for seq, (_, _, done) in zip(seqs, entries, strict=True) if done}
    chosen = streams_to_decode(pending, finished, first_chunk_frames=first, chunk_frames=chunk)

    def due(seq: Sequence) -> bool:
        return seq in finished or pending[seq] >= (first if seq.frames_sent == 0 else chunk)

    assert chosen == [seq for seq in seqs if seq in chosen]  # in the order given
    if not any(due(seq) for seq in seqs):
        assert chosen == []
        return
    for seq in seqs:
        joins = seq.frames_sent > 0 and pending[seq] >= max(1, chunk // 3)
        assert (seq in chosen) == (due(seq) or joins)


def test_chunk_sizes_keep_their_duration_at_other_frame_rates() -> None:
    assert codec_chunk_frames(200.0, 75.0) == 15 and codec_chunk_frames(107.0, 75.0) == 8
    assert codec_chunk_frames(200.0, SNAC_RATE) == 2  # SNAC: 171 ms of 200
    assert codec_chunk_frames(107.0, SNAC_RATE) == 1  # never zero
    assert codec_chunk_frames(200.0, 12.5) == 2  # Mimi: 2.5 rounds to even, 160 ms of 200
    assert codec_chunk_frames(1.0, 12.5) == 1


@pytest.mark.parametrize(
    ("frame_rate", "lookahead", "steps_per_frame", "first", "chunk", "calibration_steps", "replay"),
    [
        (75.0, 0, 1, 8, 15, 120, 750),  # EnCodec 24 kHz (cadenza-tiny): 10 s of replay
        (SNAC_RATE, 3, 7, 1 + 3, 2, 19 * 7, 117),  # SNAC 24 kHz (Orpheus): 3 frames ahead
        (12.5, 0, 1, 1, 2, 20, 125),  # Mimi (CSM): 20 frames, not 120 (1.6 s of audio)
    ],
)
def test_the_chunk_rule_in_a_codec_s_frames(
    frame_rate, lookahead, steps_per_frame, first, chunk, calibration_steps, replay
) -> None:
    frames = config_in_codec_frames(CadenzaConfig(), frame_rate, lookahead, steps_per_frame)
    assert frames == CodecFrames(first, chunk, calibration_steps, replay)


@settings(max_examples=200, deadline=None)
@given(
    st.integers(1, 750),
    st.integers(1, 750),
    st.sampled_from([75.0, SNAC_RATE, 12.5, 50.0]),
    st.integers(0, 4),
)
def test_frames_given_as_milliseconds_are_the_frames_of_before(
    first, chunk, frame_rate, lookahead
) -> None:
    """A chunk of n 75 Hz frames (the previous release's keys) written as n x 1000 / 75 ms
    is cut as it was: n frames at 75 Hz, the same duration rounded at other rates, and the
    first chunk waits for the look-ahead."""
    realtime = RealtimeConfig(first_chunk_ms=first * 1000 / 75, chunk_ms=chunk * 1000 / 75)
    frames = config_in_codec_frames(CadenzaConfig(realtime=realtime), frame_rate, lookahead, 1)
    assert frames.first_chunk_frames == max(1, round(first * frame_rate / 75)) + lookahead
    assert frames.chunk_frames == max(1, round(chunk * frame_rate / 75)) >= 1
    if frame_rate == 75.0:
        assert (frames.first_chunk_frames, frames.chunk_frames) == (first + lookahead, chunk)
