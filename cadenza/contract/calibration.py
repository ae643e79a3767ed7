"""A measured step-time model, as the engine announces it (in ``ready``) and caches it.

The engine measures it at start-up (``cadenza.engine.realtime.calibration``); the edge's
capacity model reads the same object. :data:`CALIBRATION_ADAPTER` turns it into JSON and back
for the cache file, with the same validation as the wire.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pydantic import TypeAdapter

from cadenza.contract.step_time_model import StepSample, StepTimeModel


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
    attending ``engine.calibration_long_context`` positions; 0 without that point).
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


CALIBRATION_ADAPTER: TypeAdapter[Calibration] = TypeAdapter(Calibration)
