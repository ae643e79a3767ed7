"""Measuring waves of simultaneous arrivals (:mod:`cadenza.contract.arrival_wave`): the
calibration's last step, with the fitted step-time model already guiding the deadline policy
as it will in service.

Each wave starts ``W`` synthetic streams with nominal (64-character) prompts in the same
instant, steps the engine back to back until every stream has delivered its first chunk and
:data:`CHUNKS_AFTER_FIRST` more, and turns the delivery times into the wave's
:class:`WavePoint`. Waves are measured at the sweep's batch sizes whose step fits the budget,
and one past them; each twice (up, then down), keeping the lower factor: a wave's worst
chunk is the one that decides, and a scattered measurement is priced at its slow end.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

from cadenza.contract.arrival_wave import ChunkDelivery, WavePoint, wave_max_factor
from cadenza.contract.calibration import Calibration
from cadenza.contract.stream_length import NOMINAL_TEXT_CHARS
from cadenza.engine.engine import Engine
from cadenza.engine.realtime.synthetic_streams import (
    steps_to_measure,
    synthetic_request,
    synthetic_streams_fit,
)

log = logging.getLogger(__name__)

# The chunks after a stream's first that a wave follows: the second is the most fragile (the
# listener's reserve and the first chunk run out while the whole wave decodes in phase), the
# third shows whether the wave has caught up.
CHUNKS_AFTER_FIRST = 2

# A wave no deadline limits (every chunk far ahead) is recorded at this factor: finite, so the
# calibration stays plain JSON.
MAX_FACTOR = 100.0


def wave_sizes(decode_points: Sequence[tuple[int, int, float]], budget_ms: float) -> list[int]:
    """The wave sizes to measure: every calibrated batch whose step fits ``budget_ms``, and the
    next one past them (what a claim at the calibration's speed could admit at once)."""
    sizes = [tokens for tokens, _, ms in decode_points if ms <= budget_ms]
    beyond = [tokens for tokens, _, ms in decode_points if ms > budget_ms]
    if beyond:
        sizes.append(beyond[0])
    return sorted(set(sizes))


def measure_waves(engine: Engine, calibration: Calibration, budget_ms: float) -> list[WavePoint]:
    """Waves of :func:`wave_sizes` arrivals on ``engine`` (idle), its deadline policy guided by
    ``calibration`` meanwhile; each size measured twice, keeping the lower factor. The engine
    is idle again afterwards, with the calibration it had before."""
    sizes = [
        size
        for size in wave_sizes(calibration.model.decode_points, budget_ms)
        if size <= engine.scheduler.max_num_seqs
        and synthetic_streams_fit(engine, size, NOMINAL_TEXT_CHARS)
    ]
    previous = engine.calibration
    engine.apply_calibration(calibration)
    measured: dict[int, WavePoint] = {}
    try:
        for size in [*sizes, *reversed(sizes)]:
            point = measure_wave(engine, size)
            earlier = measured.get(size, point)
            measured[size] = WavePoint(
                size,
                min(point.max_factor, earlier.max_factor),
                max(point.span_s, earlier.span_s),
            )
    finally:
        engine.apply_calibration(previous)
    return [measured[size] for size in sorted(measured)]


def measure_wave(engine: Engine, streams: int) -> WavePoint:
    """One wave: ``streams`` nominal streams added at once, stepped back to back until each has
    its first chunk and :data:`CHUNKS_AFTER_FIRST` more (or the synthetic streams run out)."""
    if engine.has_unfinished_requests():
        raise RuntimeError("a wave needs an idle engine")
    info = engine.info
    plan = info.realtime
    requests = [
        synthetic_request(engine, NOMINAL_TEXT_CHARS, "calibration") for _ in range(streams)
    ]
    chunks: dict[str, list[ChunkDelivery]] = {r.request_id: [] for r in requests}
    samples: dict[str, int] = dict.fromkeys(chunks, 0)
    wanted = 1 + CHUNKS_AFTER_FIRST
    try:
        started = time.monotonic()
        for request in requests:
            engine.add_request(request)
        for _ in range(steps_to_measure(engine) * 4):
            outputs = engine.step()
            now = time.monotonic() - started
            for output in outputs:
                if output.audio.size == 0 or output.request_id not in chunks:
                    continue
                audio_s = samples[output.request_id] / info.sample_rate
                chunks[output.request_id].append(ChunkDelivery(now, audio_s))
                samples[output.request_id] += int(output.audio.size)
            if all(len(c) >= wanted or _finished(engine, rid) for rid, c in chunks.items()):
                break
    finally:
        for request in requests:
            engine.abort_request(request.request_id)
        engine.step()  # delivers (and drops) the cancellations
        engine.take_report()
    followed = [c[:wanted] for c in chunks.values()]
    factor = min(wave_max_factor(followed, plan.ttfa_target_s, plan.playout_reserve_s), MAX_FACTOR)
    span_s = max((c[-1].delivered_s for c in followed if c), default=0.0)
    log.debug("wave of %d streams: max factor %.2f over %.2f s", streams, factor, span_s)
    return WavePoint(streams, round(factor, 4), round(span_s, 4))


def _finished(engine: Engine, request_id: str) -> bool:
    return engine.sequence(request_id) is None
