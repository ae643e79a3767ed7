"""A measured step-time model, as the engine announces it (in ``ready``) and caches it.

The engine measures it at start-up (``cadenza.engine.realtime.calibration``); the edge's
capacity model reads the same object. :data:`CALIBRATION_ADAPTER` turns it into JSON and back
for the cache file, with the same validation as the wire.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pydantic import TypeAdapter

from cadenza.contract.arrival_wave import WavePoint
from cadenza.contract.step_time_model import StepSample, StepTimeModel


@dataclass(frozen=True)
class StepRepeat:
    """One calibration point measured twice (ms per step each time): ``tokens`` streams at
    ``context_tokens`` positions in all. The slower counts (the claim is priced at the slow
    end of what the machine does); two that disagree by much say it was busy meanwhile.
    ``cpu_share``: the least share of its cores' time the engine got while timing it (its CPU
    time over the wall time times its threads; well below 1, something else ran on its
    cores)."""

    tokens: int
    context_tokens: int
    first_ms: float
    again_ms: float
    cpu_share: float = 1.0

    @property
    def spread(self) -> float:
        """The slower measurement over the faster, less one."""
        return max(self.first_ms, self.again_ms) / max(min(self.first_ms, self.again_ms), 1e-9) - 1


@dataclass(frozen=True)
class Calibration:
    """A fitted step-time model and the points it came from.

    ``codec_ms_per_frame``: streaming decode time per stream-frame at the largest batch;
    ``identity``: the cache key (a hash of everything that changes step time);
    ``measured_s``: how long the sweep took; ``source``: measured now or read from the cache.
    ``jitter``: how much slower than its median a one-chunk window of steps runs at the 90th
    percentile (pooled over the sweep's points; >= 1), what admission allows for until live
    steps say otherwise. ``throughput_streams``: the engine's saturated throughput, codec
    frames per second at the best measured batch over the frame rate: streams no scheduler
    could exceed on this device (short contexts, nothing else running);
    ``long_context_throughput_streams`` the same at the long-context point (every stream
    attending ``calibration.long_context_tokens`` positions; 0 without that point).
    ``repeats``: every point's two measurements; ``attempts``: sweeps run before this one was
    kept; ``problems``: where the measurements contradict each other or the fit (empty: a
    consistent calibration; otherwise the engine serves with a conservative one and never
    caches it, :mod:`cadenza.engine.realtime.calibration_checks`). ``waves``: waves of
    simultaneous arrivals measured through their first chunks and the chunks after them
    (:mod:`cadenza.contract.arrival_wave`; empty: not measured, no limit of that kind).
    """

    model: StepTimeModel
    samples: tuple[StepSample, ...]
    codec_ms_per_frame: float
    device_name: str
    identity: str
    measured_s: float
    source: Literal["measured", "cache"] = "measured"
    jitter: float = 1.0
    throughput_streams: float = 0.0
    long_context_throughput_streams: float = 0.0
    repeats: tuple[StepRepeat, ...] = ()
    attempts: int = 1
    problems: tuple[str, ...] = ()
    waves: tuple[WavePoint, ...] = ()

    @property
    def consistent(self) -> bool:
        return not self.problems


CALIBRATION_ADAPTER: TypeAdapter[Calibration] = TypeAdapter(Calibration)
