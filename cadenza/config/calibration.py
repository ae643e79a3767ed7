"""``[calibration]``: the step-time sweep an engine runs at start-up, its checks and its cache
(``engine/realtime/calibration.py``; docs/capacity.md)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from cadenza.config.section import Section


class CalibrationConfig(Section):
    """What the start-up sweep measures, how often it may try, and where it is cached."""

    mode: Literal["auto", "refresh", "off"] = Field(
        "auto",
        description="step-time sweep at start-up: auto (cached per model and device), "
        "refresh (measure again), off (no real-time admission)",
    )
    batch_sizes: tuple[int, ...] = Field(
        (1, 2, 4, 8, 12, 16, 20, 24, 32, 48, 64),
        min_length=1,
        description="decoding streams per calibration point (stops once steps are too slow)",
    )
    duration_ms: float = Field(
        1600.0,
        gt=0,
        le=15000,
        description="audio timed per calibration point, in the decode steps of the codec's "
        "nearest whole number of frames (at least two steps; EnCodec 120 frames, Mimi 20), "
        "measured in windows of one chunk",
    )
    long_context_tokens: int = Field(
        1024, ge=0, description="prompt tokens of the long-context calibration point (0: none)"
    )
    attempts: int = Field(
        3,
        ge=1,
        le=10,
        description="sweeps a start may run until one agrees with itself (its repeated "
        "points and its fit; a busy machine's do not; one measured while something else ran "
        "on its cores ends them, as the next would meet the same neighbour); then it serves "
        "with a conservative one, never cached (/readyz and the log say so)",
    )
    remeasure_idle_s: float = Field(
        30.0,
        ge=0,
        description="an engine serving with a conservative calibration (none of its sweeps "
        "agreed with itself: the machine was busy) measures again once it has been idle "
        "this long, stopping at the next step when a request arrives; one that agrees "
        "replaces it (and is cached). After a sweep that still disagrees the wait doubles, "
        "up to 16 times as long. 0: never",
    )
    tolerance: float = Field(
        0.5,
        gt=0,
        description="how far a sweep's two measurements of a point (and a larger batch's "
        "step below a smaller one's) may disagree, as a share, before the sweep counts as "
        "taken on a busy machine and is measured again; its segments' slopes are held to "
        "3 x (1 + this) their median, and the engine must have had 1 - 0.7 x this of its "
        "cores' time while it measured",
    )
    cache_dir: str | None = Field(
        None, description="where calibrations are cached (unset: ~/.cache/cadenza)"
    )
