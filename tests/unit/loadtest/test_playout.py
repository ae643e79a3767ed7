"""Load-test arithmetic on synthetic arrival traces: known underruns give known C100 and TTFA."""

from __future__ import annotations

import random

import pytest

from cadenza.loadtest.level_summary import (
    StreamResult,
    level_passes,
    percentile,
    summarize_level,
)
from cadenza.loadtest.playout import Chunk, simulate_playout
from cadenza.loadtest.workload import LoadOptions, TextLengths, WorkloadError


def steady(start: float, chunk_s: float, count: int, early: float = 0.0) -> list[Chunk]:
    """Chunks of ``chunk_s`` audio arriving exactly in real time (``early`` seconds ahead)."""
    return [Chunk(start + i * chunk_s - early * (i > 0), chunk_s) for i in range(count)]


def test_real_time_arrivals_never_underrun() -> None:
    playout = simulate_playout(steady(10.0, 0.2, 20), client_buffer_s=0.1, origin_s=9.8)
    assert playout.longest_underrun_s == 0.0 and not playout.underruns
    assert playout.audio_s == pytest.approx(4.0)
    assert playout.jitter_p95_s == pytest.approx(0.0, abs=1e-9)


def test_a_late_chunk_gives_a_known_underrun() -> None:
    chunks = steady(10.0, 0.2, 10)
    # Chunk 5 is due at 10.0 + 0.1 + 5 * 0.2 = 11.1 (buffer 100 ms); it lands at 11.25.
    chunks[5] = Chunk(11.25, 0.2)
    chunks[6:] = [Chunk(11.25 + 0.01 * i, 0.2) for i in range(1, 5)]
    playout = simulate_playout(chunks, client_buffer_s=0.1, origin_s=10.0)
    assert len(playout.underruns) == 1
    assert playout.longest_underrun_s == pytest.approx(0.15)
    assert playout.underruns[0].at_s == pytest.approx(1.1)
    # A 300 ms buffer absorbs it; 200 ms leaves 50 ms of it.
    assert simulate_playout(chunks, client_buffer_s=0.3, origin_s=10.0).underruns == ()
    shorter = simulate_playout(chunks, client_buffer_s=0.2, origin_s=10.0)
    assert shorter.longest_underrun_s == pytest.approx(0.05)


def test_playback_ends_after_the_buffer_the_audio_and_every_underrun() -> None:
    # 2 s of audio from 10.0, a 100 ms buffer: heard to its end at 12.1 when on time...
    assert simulate_playout(steady(10.0, 0.2, 10), 0.1, origin_s=9.8).ends_s == pytest.approx(12.1)
    # ...and 150 ms later after a 150 ms underrun; arriving early ends nothing sooner.
    chunks = steady(10.0, 0.2, 10)
    chunks[5:] = [Chunk(11.25 + 0.01 * i, 0.2) for i in range(5)]
    assert simulate_playout(chunks, 0.1, origin_s=10.0).ends_s == pytest.approx(12.25)
    early = steady(10.0, 0.2, 10, early=0.5)
    assert simulate_playout(early, 0.1, origin_s=9.8).ends_s == pytest.approx(12.1)


def test_level_summary_counts_outcomes_percentiles_and_c_scores() -> None:
    results = []
    for i in range(100):
        chunks = steady(float(i), 0.2, 10)
        if i < 3:  # three streams with one 150 ms underrun each
            chunks[4] = Chunk(chunks[4].arrival_s + 0.25, 0.2)
        playout = simulate_playout(chunks, 0.1, origin_s=i - 0.1 - 0.001 * i)
        results.append(StreamResult("served", float(i), ttfa_s=0.1 + 0.001 * i, playout=playout))
    results.append(StreamResult("refused", 5.0, reason="queue_full"))
    results.append(StreamResult("error", 6.0, reason="no_audio"))
    level = summarize_level(8, results, client_cpu=0.2, duration_s=20.0)
    assert level["offered"] == 102 and level["admitted"] == 100
    assert level["rejected_by_reason"] == {"queue_full": 1}
    assert level["errors_by_reason"] == {"no_audio": 1}
    assert level["c100"] == pytest.approx(0.97)
    assert level["c200"] == 1.0
    assert level["ttfa_ms"]["p50"] == pytest.approx(149.0)
    assert level["ttfa_ms"]["p95"] == pytest.approx(194.0)
    assert level["ttfa_ms"]["p99"] == pytest.approx(198.0)
    assert not level_passes(level, slo_ttfa_ms=500)  # refused and errored streams
    clean = summarize_level(8, results[3:100])
    assert level_passes(clean, slo_ttfa_ms=500)
    assert not level_passes(clean, slo_ttfa_ms=150)
    # The underrun SLO is the run's: at 200 ms the three 150 ms underruns are within it.
    lenient = summarize_level(8, results[:100], slo_underrun_ms=200.0)
    assert lenient["c_slo"] == 1.0 and level_passes(lenient, slo_ttfa_ms=500)
    assert not level_passes(summarize_level(8, results[:100]), slo_ttfa_ms=500)


def test_queued_streams_count_their_wait_in_ttfa() -> None:
    playout = simulate_playout(steady(12.0, 0.2, 5), 0.1, origin_s=10.0)
    queued = StreamResult("queued_served", 0.0, queued_s=1.8, ttfa_s=2.0, playout=playout)
    level = summarize_level(1, [queued])
    assert level["queued"] == 1 and level["admitted"] == 1
    assert level["ttfa_ms"]["p50"] == 2000.0
    assert level["ttfa_admitted_ms"]["p50"] == pytest.approx(200.0)


def test_percentile_nearest_rank() -> None:
    assert percentile([], 50) is None
    assert percentile([3.0, 1.0, 2.0], 50) == 2.0
    assert percentile(list(range(1, 101)), 95) == 95


def test_text_lengths_parse_and_sample() -> None:
    lengths = TextLengths.parse("uniform:20-30")
    rng = random.Random(0)
    assert all(1 <= len(lengths.sample(rng)) <= 30 for _ in range(50))
    assert TextLengths.parse("fixed:12") == TextLengths(12, 12)
    for garbage in ("", "uniform:", "uniform:9-3", "fixed:x", "normal:1-2", "fixed:0"):
        with pytest.raises(WorkloadError):
            TextLengths.parse(garbage)
    assert LoadOptions("http://h:1").ws_url == "ws://h:1/v1/stream"


def test_each_chunk_says_how_long_the_player_waited_for_it():
    chunks = [Chunk(0.0, 0.2), Chunk(0.1, 0.2), Chunk(0.9, 0.2)]
    playout = simulate_playout(chunks, 0.1, origin_s=0.0)
    assert playout.starved_s == pytest.approx((0.0, 0.0, 0.4))  # ran dry at 0.5


def test_text_stream_levels_report_segment_gaps_and_last_text_to_end():
    from cadenza.loadtest.level_summary import StreamResult, summarize_level

    playout = simulate_playout([Chunk(0.0, 1.0)], 0.1, origin_s=0.0)
    streams = [
        StreamResult("served", 0.0, ttfa_s=0.2, playout=playout, segment_gaps_s=(0.0, 0.05),
                     text_to_end_s=1.5),
        StreamResult("served", 0.1, ttfa_s=0.2, playout=playout, segment_gaps_s=(0.0,),
                     text_to_end_s=2.5),
    ]  # fmt: skip
    text = summarize_level(2, streams)["text_stream"]
    assert text["segments"] == 5
    assert text["segment_gap_ms"] == {"p50": 0.0, "p99": 50.0, "max": 50.0}
    assert text["last_text_to_end_ms"] == {"p50": 1500.0, "p99": 2500.0}
    plain = StreamResult("served", 0.0, ttfa_s=0.2, playout=playout)
    assert summarize_level(1, [plain])["text_stream"] is None


def test_a_text_stream_workload_speaks_in_sentences_cut_into_tokens():
    from cadenza.loadtest.workload import LoadOptions, WorkloadError, as_sentences, llm_tokens

    text = as_sentences("one two three four five", words_per_sentence=2)
    assert text == "One two. Three four. Five."
    tokens = llm_tokens("a wonderful day")
    assert "".join(tokens) == "a wonderful day" and max(map(len, tokens)) <= 4
    with pytest.raises(WorkloadError, match="--transport ws"):
        LoadOptions("http://127.0.0.1:1", transport="http", text_stream_tokens_per_s=20)
    with pytest.raises(WorkloadError, match="positive"):
        LoadOptions("http://127.0.0.1:1", text_stream_tokens_per_s=0)
