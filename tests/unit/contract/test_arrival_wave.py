"""Waves of simultaneous arrivals: each chunk's deadline as a bound on the step slowdown, and
the limit the edge draws from the measured waves."""

from __future__ import annotations

import math

import pytest

from cadenza.contract.arrival_wave import (
    ChunkDelivery,
    WavePoint,
    chunk_max_factor,
    wave_limit,
    wave_max_factor,
    wave_span_s,
)

TTFA_S, RESERVE_S = 0.3, 0.1


def test_a_first_chunk_is_bounded_by_the_ttfa_target() -> None:
    assert chunk_max_factor(0.15, ChunkDelivery(0.15, 0.0), TTFA_S, RESERVE_S) == pytest.approx(2)


def test_a_later_chunk_is_bounded_by_the_reserve_and_the_audio_before_it() -> None:
    # Second chunk starts 107 ms into the audio: due 207 ms after the first chunk landed.
    chunk = ChunkDelivery(0.15 + 0.23, 0.107)
    assert chunk_max_factor(0.15, chunk, TTFA_S, RESERVE_S) == pytest.approx(0.207 / 0.23)


def test_the_worst_chunk_of_the_wave_decides() -> None:
    calm = [ChunkDelivery(0.1, 0.0), ChunkDelivery(0.2, 0.107), ChunkDelivery(0.4, 0.307)]
    late = [ChunkDelivery(0.12, 0.0), ChunkDelivery(0.42, 0.107)]
    factor = wave_max_factor([calm, late, []], TTFA_S, RESERVE_S)
    assert factor == pytest.approx(0.207 / 0.30)
    assert wave_max_factor([], TTFA_S, RESERVE_S) == math.inf


def test_the_limit_is_the_largest_wave_holding_at_the_factor() -> None:
    points = [WavePoint(4, 3.0, 0.6), WavePoint(8, 2.0, 0.7), WavePoint(16, 1.2, 0.9)]
    assert wave_limit(points, 1.0) == 16
    assert wave_limit(points, 2.0) == 8
    # Between 8 (holds to 2.0) and 16 (to 1.2): linear in the streams.
    assert wave_limit(points, 1.4) == 8 + math.floor((2.0 - 1.4) / 0.8 * 8)
    assert wave_limit(points, 5.0) == 1  # an idle replica always takes one
    assert wave_limit([], 1.0) is None


def test_a_larger_wave_never_holds_more_than_a_smaller_one() -> None:
    # A noisy small wave caps the larger ones measured after it.
    points = [WavePoint(4, 1.1, 0.5), WavePoint(8, 2.0, 0.7)]
    assert wave_limit(points, 1.5) == 1
    assert wave_limit(points, 1.05) == 8


def test_the_span_grows_with_the_factor_and_the_wave() -> None:
    points = [WavePoint(4, 3.0, 0.6), WavePoint(8, 2.0, 0.7)]
    assert wave_span_s(points, 3, 1.0) == pytest.approx(0.6)
    assert wave_span_s(points, 6, 1.5) == pytest.approx(1.05)
    assert wave_span_s(points, 20, 1.0) == pytest.approx(0.7)
    assert wave_span_s(points, 20, 0.5) == pytest.approx(0.7)  # never below the measured
    assert wave_span_s([], 4, 1.0) == 0.0
