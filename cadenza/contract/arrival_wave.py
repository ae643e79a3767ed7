"""Streams arriving together: how many a replica can start at once and keep on time through
their first chunks and the chunks after them.

A wave of ``W`` streams arriving in the same instant is a replica's hardest moment: their
prompts are prefilled together, their first chunks come out in the same steps, and their later
chunks fall due in phase, so the codec decodes every stream's chunk in one call while the
listeners' reserves run out together. The steady-state claim (a step of ``B`` streams within
the budget) does not price that: a claim of 34 streams held steadily on a 2-core Xeon, yet a
wave of 34 fresh streams had every second chunk late by 60-200 ms.

The engine measures waves at calibration (:mod:`cadenza.engine.realtime.arrival_waves`): it
starts ``W`` synthetic streams at once, steps back to back, and records when each chunk of
each stream was delivered. Every deadline of a wave depends on how fast the steps ran: the
first chunk is due ``ttfa_target`` after arrival, and a later chunk starting ``a`` seconds into
a stream's audio is due ``reserve + a`` after its first chunk landed. If every step ran ``F``
times slower (the realtime factor the edge applies to the calibration), delivery times scale
by ``F``, so each chunk's deadline holds up to a factor it alone sets::

    first chunk:   F x t_first              <= ttfa_target
    later chunk:   F x (t_chunk - t_first)  <= reserve + a_chunk

The least of those over the wave is the wave's :attr:`WavePoint.max_factor`. The edge admits
at once no more streams than the largest wave whose ``max_factor`` is at least the realtime
factor now (:func:`wave_limit`), counting every stream admitted within the wave's span.

Torch-free: the engine measures, the edge counts.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class WavePoint:
    """A measured wave of ``streams`` simultaneous arrivals: ``max_factor``, the largest factor
    by which every step could have run slower with every chunk of it still on time
    (``inf``: no deadline depended on the steps; below 1: late even as measured);
    ``span_s``, from the arrivals to the last chunk measured (at the calibration's speed)."""

    streams: int
    max_factor: float
    span_s: float


@dataclass(frozen=True)
class ChunkDelivery:
    """One chunk of one stream of a wave: delivered ``delivered_s`` after the arrivals,
    starting ``audio_s`` into the stream's audio (0: the first chunk)."""

    delivered_s: float
    audio_s: float


def chunk_max_factor(
    first_s: float, chunk: ChunkDelivery, ttfa_target_s: float, reserve_s: float
) -> float:
    """The largest step slowdown under which ``chunk`` still meets its deadline, for a stream
    whose first chunk came ``first_s`` after it arrived (``inf``: none limits it)."""
    if chunk.audio_s <= 0.0:
        return ttfa_target_s / chunk.delivered_s if chunk.delivered_s > 0 else math.inf
    work_s = chunk.delivered_s - first_s
    return (reserve_s + chunk.audio_s) / work_s if work_s > 0 else math.inf


def wave_max_factor(
    streams: Sequence[Sequence[ChunkDelivery]], ttfa_target_s: float, reserve_s: float
) -> float:
    """:attr:`WavePoint.max_factor` of a wave: the least :func:`chunk_max_factor` over every
    chunk of every stream (each stream's chunks in delivery order, its first chunk first)."""
    factor = math.inf
    for chunks in streams:
        if not chunks:
            continue
        first_s = chunks[0].delivered_s
        for chunk in chunks:
            factor = min(factor, chunk_max_factor(first_s, chunk, ttfa_target_s, reserve_s))
    return factor


def wave_limit(points: Sequence[WavePoint], factor: float) -> int | None:
    """The most streams that may arrive together at ``factor``: over the measured waves, forced
    monotone (a larger wave never holds at a larger factor than a smaller one), the largest
    size whose factor is at least ``factor``, interpolated linearly between measured sizes.
    At least 1 (an idle replica always admits one stream); ``None`` without measured waves
    (no limit of this kind). Past the largest measured wave nothing is assumed: the limit is
    at most its size."""
    if not points:
        return None
    ordered = sorted(points, key=lambda p: p.streams)
    monotone: list[tuple[int, float]] = []
    ceiling = math.inf
    for point in ordered:
        ceiling = min(ceiling, point.max_factor)
        monotone.append((point.streams, ceiling))
    best = 1
    previous: tuple[int, float] | None = None
    for streams, max_factor in monotone:
        if max_factor >= factor:
            best = max(best, streams)
        elif previous is not None and previous[1] >= factor and math.isfinite(previous[1]):
            # Between a wave that holds and one that does not: linear in the streams.
            low_streams, low_factor = previous
            share = (low_factor - factor) / (low_factor - max_factor)
            best = max(best, low_streams + math.floor(share * (streams - low_streams)))
            break
        else:
            break
        previous = (streams, max_factor)
    return best


def wave_span_s(points: Sequence[WavePoint], streams: int, factor: float) -> float:
    """How long a wave of ``streams`` arrivals occupies the replica at ``factor``: the span of
    the smallest measured wave at least that large (else the largest), times ``factor``; 0
    without measured waves."""
    if not points:
        return 0.0
    ordered = sorted(points, key=lambda p: p.streams)
    chosen = next((p for p in ordered if p.streams >= streams), ordered[-1])
    return chosen.span_s * max(factor, 1.0)
