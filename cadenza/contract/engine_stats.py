"""What the engine reports every 0.5 s (the ``stats`` message, also its heartbeat)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, NamedTuple

STATS_INTERVAL_S = 0.5  # how often the engine reports (and, in doing so, says it is alive)


@dataclass(frozen=True)
class EngineStats:
    """A snapshot of the engine's counters. ``prefix_*_tokens``, ``num_preemptions`` and
    ``skipped_steps`` count since start-up; ``step_correction`` is measured over calibrated
    step time (1.0 when uncalibrated); ``spare_lead_s``: how much longer than predicted the
    next step could take before any playing stream would eat into its playout reserve (the
    least time to spare among the running streams past their first chunk; ``None`` without
    any), what a new stream's prefill may borrow."""

    num_running: int
    num_waiting: int
    max_num_seqs: int
    kv_pages_total: int
    kv_pages_free: int
    num_preemptions: int
    prefix_hit_tokens: int
    prefix_query_tokens: int
    skipped_steps: int
    step_correction: float
    spare_lead_s: float | None = None

    @property
    def num_requests(self) -> int:
        return self.num_running + self.num_waiting


class StepRecord(NamedTuple):
    """One engine step: wall time, decode tokens, all rows computed, KV positions attended,
    how long the engine had been idle just before it (a step after a rest starts with cold
    caches), and the part of its time the streaming codec took (chunks of several frames
    are decoded at once, so a few steps carry the codec time of many)."""

    seconds: float
    decodes: int
    tokens: int
    context_tokens: int
    rested_s: float = 0.0
    codec_s: float = 0.0


@dataclass(frozen=True)
class StepReport:
    """What happened since the last report: every step, the slack of every audio chunk
    delivered (seconds before its playout deadline; negative: late), and the time the
    streaming codec took for how many stream-frames."""

    steps: tuple[StepRecord, ...] = ()
    chunk_slack_s: tuple[float, ...] = ()
    codec_s: float = 0.0
    codec_frames: int = 0


ProbeOutcome = Literal["done", "interrupted", "timed_out", "busy", "unsupported"]


@dataclass(frozen=True)
class ProbeResult:
    """What a probe ran (:mod:`cadenza.engine.realtime.probe`): ``report``, its steps;
    ``batch``, the synthetic streams (0: none ran); ``outcome``: ``done``, ``interrupted``
    (something arrived for the engine), ``timed_out`` (its time ran out first), ``busy``
    (the engine was not idle: nothing ran) or ``unsupported`` (no calibrated step-time model
    to probe against)."""

    report: StepReport
    batch: int
    outcome: ProbeOutcome
