"""How much slower than calibrated one engine replica's steps run: the *realtime factor* every
step-time prediction of admission is multiplied by.

Evidence comes in windows, each a sum of measured over predicted decode time:

* **live windows**: the engine's steps while it serves, summed over ``max_lead_s`` (a slower
  spell shorter than the lead its streams run ahead is absorbed by that lead);
* **probe windows**: synthetic decode steps the engine runs on request while it is idle
  (:mod:`cadenza.engine.realtime.probe`), at the batch the claim would like to reach. They
  measure the machine now without the edge and the clients at work, so they count times the
  *serving floor* (what served steps run over idle ones on this machine, below), and never
  below it.

The factor is the largest of three things::

    evidence   90th percentile of the windows, each weighing its predicted decode work, over
               admission.jitter_window_s (and at least the latest ten windows, however old);
               with fewer than three windows, the largest of them and the prior (below)
    hold       every live verdict (the evidence as each window closed) of the last
               admission.factor_recovery_s: under load a slower verdict counts at once, a
               faster one once it has held that long (the machine's speed swings by more than
               one window shows)
    climb      after a probe: the factor the load had measured, falling e-fold every
               admission.factor_climb_s (the claim climbs back at a bounded rate)

A probe is what lets the claim heal without load: a claim of one stream can never *serve*
enough to prove the machine faster. When the engine has nothing to do and the factor is above
the serving floor, the edge asks for a probe every ``admission.probe_interval_s``; a probe
that finds the machine near its calibration again ends the load's windows and hold (that load
is over), and the climb takes their place, so a hiccup costs its own duration plus about
``factor_climb_s * ln(factor / floor)``, not minutes. A slowdown still cuts the claim at once:
slower windows, live or probed, are the evidence.

The prior (before three windows) is the *serving floor*: the factor the last server on this
machine measured under load (remembered: a hint that ages and is capped,
:mod:`cadenza.edge.admission.factor_memory`) or, with none, ``admission.unmeasured_factor``;
at least the calibration's jitter. Never less than the jitter times the replicas sharing this
one's cores (:mod:`cadenza.contract.cpu_replicas`).

Two kinds of step time are not held against the model: steps right after the engine rested
(cold caches; it rests only while every stream is far ahead of its listener), and the codec's
lumps (it decodes chunks of several frames on a few steps): each step counts its frames' share
of the codec's recent time instead, as the calibration's mean step times do.

No torch here: this runs in the edge.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from cadenza.config import AdmissionConfig
from cadenza.contract.engine_info import EngineInfo
from cadenza.contract.engine_stats import STATS_INTERVAL_S, StepReport
from cadenza.edge.admission.factor_memory import RememberedFactor

MIN_WINDOW_MS = 50.0  # a window with less decoding than this says little about speed
# A step after the engine rested this long starts with cold caches (see the module docstring).
_REST_S = 0.002
_MIN_WINDOWS = 3  # live windows for a percentile (fewer: the worst of them and the prior)
_KEEP_WINDOWS = 10  # the latest windows stand, however old, until newer ones replace them
FACTOR_RANGE = (0.5, 20.0)
# What a CPU engine's served steps are assumed to run against its calibration before anything
# is measured or remembered: the edge and the clients share its cores (1.1-1.7 measured on the
# 2-core development machine, docs/journal/2026-12-03-closed-loop-listeners.md). Erring slow is
# the safe side: live windows replace it within seconds of load, and a claim that starts low
# only rises.
UNMEASURED_CPU_FACTOR = 1.4
_PROBE_WANTED_ABOVE = 1.05  # probe while the factor is this far above the serving floor
# A probe that runs within this much of the calibration says the machine is itself again: the
# load the earlier windows measured is over. A slower one is evidence, no more: under ongoing
# contention an idle engine's probe is a moment, and the served windows know better.
LOAD_OVER_BELOW = 1.5
LOAD_EASED_BY = 1.5  # ...as does one that counts this many times below the factor in use
_PROBE_HELPED_BELOW = 0.95  # a probe that ends a load below this share of the factor helped
# Unhelpful probes in a row, at most, that double the wait: an idle server probes a machine
# that stays slow every 8 s rather than every 2, and still sees a load end within 8 s.
_PROBE_BACKOFF = 2


@dataclass(frozen=True)
class Window:
    """Measured over predicted decode time (``ratio``, for a probe at least the serving
    floor) summed over one window closed at ``at``, weighing its predicted ``work_ms``."""

    at: float
    ratio: float
    work_ms: float
    probe: bool = False


class RealtimeFactorEstimator:
    """``remembered``: the factor the last server on this machine measured under load, and its
    age (:meth:`FactorMemory.recall`); ``core_sharers``: engine replicas sharing this one's
    cores."""

    def __init__(
        self,
        info: EngineInfo,
        config: AdmissionConfig,
        clock: Callable[[], float] = time.monotonic,
        core_sharers: int = 1,
        remembered: RememberedFactor | None = None,
    ) -> None:
        self.info = info
        self.config = config
        self.clock = clock
        self.core_sharers = core_sharers
        self.remembered = remembered
        self.step_model = None if info.calibration is None else info.calibration.model
        self.windows: deque[Window] = deque(maxlen=1024)  # pruned by evidence(), bounded anyway
        # (time, the evidence) at each live window's close, over factor_recovery_s
        self._verdicts: deque[tuple[float, float]] = deque(maxlen=1024)
        # the live window being filled: measured and predicted decode ms, reports in it
        self._filling_measured_ms = self._filling_predicted_ms = 0.0
        self._filling_reports = 0
        # (time, codec seconds, stream-frames) per report, over the jitter window
        self._codec: deque[tuple[float, float, int]] = deque(maxlen=1024)
        self._climb: tuple[float, float] | None = None  # (factor, since) after a probe
        self.probes = 0  # probe windows counted
        self.last_probe_ratio: float | None = None  # measured, before the floor
        self._next_probe_at = -math.inf
        self._unhelpful_probes = 0  # in a row: each doubles the wait for the next

    # -- evidence in ---------------------------------------------------------------------------

    def observe(self, report: StepReport) -> None:
        """Fold one engine report (its live steps) in."""
        now = self.clock()
        self._codec.append((now, report.codec_s, report.codec_frames))
        measured, predicted = self._decode_ms(report, self._codec_ms_per_frame(now))
        if predicted <= 0:
            return
        self._filling_measured_ms += measured
        self._filling_predicted_ms += predicted
        self._filling_reports += 1
        if (
            self._filling_reports * STATS_INTERVAL_S >= self.window_s
            and self._filling_measured_ms >= MIN_WINDOW_MS
        ):
            ratio = self._filling_measured_ms / self._filling_predicted_ms
            self.windows.append(Window(now, ratio, self._filling_predicted_ms))
            self._filling_measured_ms = self._filling_predicted_ms = 0.0
            self._filling_reports = 0
            if self.config.factor_recovery_s > 0 and self.has_live_factor():
                self._verdicts.append((now, self.evidence()))

    def observe_probe(self, report: StepReport) -> bool:
        """Fold in the steps of a probe the engine ran while idle; ``False`` when they held
        too little decoding to say anything. A probe that ran within :data:`LOAD_OVER_BELOW`
        of the calibration, or counts :data:`LOAD_EASED_BY` times below the factor in use,
        ends the load the earlier windows measured: they and their hold give way to the
        climb, from the factor they had set; any other is one more window."""
        frames = report.codec_frames
        codec_ms = 1000.0 * report.codec_s / frames if frames else None
        measured, predicted = self._decode_ms(report, codec_ms)
        if predicted <= 0 or measured < MIN_WINDOW_MS / 2:
            return False
        now = self.clock()
        before = self.factor()
        ratio = measured / predicted
        counted = max(ratio, 1.0) * self.serving_floor
        helped = False  # a probe that finds the load still on raises no claim
        if ratio <= LOAD_OVER_BELOW or LOAD_EASED_BY * counted <= before:
            # The machine runs near its calibration again, or far faster than the factor in
            # use: the load the windows measured is over, and the climb takes their place.
            measured_factor = self._measured_factor(now)
            self._climb = (measured_factor, now) if measured_factor > counted else None
            self.windows.clear()
            self._verdicts.clear()
            self._filling_measured_ms = self._filling_predicted_ms = 0.0
            self._filling_reports = 0
            helped = counted < _PROBE_HELPED_BELOW * before
        self.windows.append(Window(now, counted, predicted, probe=True))
        self.probes += 1
        self.last_probe_ratio = ratio
        self._unhelpful_probes = 0 if helped else min(self._unhelpful_probes + 1, _PROBE_BACKOFF)
        wait_s = self.config.probe_interval_s * 2**self._unhelpful_probes
        self._next_probe_at = now + wait_s
        return True

    def _decode_ms(
        self, report: StepReport, codec_ms_per_frame: float | None
    ) -> tuple[float, float]:
        """Measured and predicted ms of the decode-dominated steps of ``report`` that count
        (not right after a rest), each with its frames' share of ``codec_ms_per_frame``
        instead of the codec calls it happened to carry."""
        measured = predicted = 0.0
        if self.step_model is None:
            return measured, predicted
        for step in report.steps:
            counted = step.decodes > 0 and step.tokens <= 2 * step.decodes
            if not counted or step.rested_s > _REST_S:
                continue
            measured += 1000.0 * step.seconds
            if codec_ms_per_frame is not None:
                frames = step.decodes / self.info.shape.steps_per_frame
                measured += frames * codec_ms_per_frame - 1000.0 * step.codec_s
            predicted += self.step_model.predict_ms(step.tokens, step.context_tokens)
        return measured, predicted

    def _codec_ms_per_frame(self, now: float) -> float | None:
        """The codec's time per stream-frame over the jitter window (``None`` before it has
        decoded anything)."""
        while self._codec and now - self._codec[0][0] > self.config.jitter_window_s:
            self._codec.popleft()
        frames = sum(f for _, _, f in self._codec)
        return 1000.0 * sum(s for _, s, _ in self._codec) / frames if frames else None

    # -- the factor out ------------------------------------------------------------------------

    @property
    def window_s(self) -> float:
        """How much engine time one live window sums (in reports of ``STATS_INTERVAL_S``): the
        engine's lead cap, at least one report and at most a fifth of the jitter window."""
        lead_s = self.info.realtime.max_lead_s
        return min(max(lead_s, STATS_INTERVAL_S), self.config.jitter_window_s / 5)

    def has_live_factor(self) -> bool:
        """Whether the evidence now comes from live windows alone (enough of them)."""
        return sum(1 for w in self.windows if not w.probe) >= _MIN_WINDOWS

    def factor(self) -> float:
        """What admission multiplies step-time predictions by: the evidence, the hold and the
        climb, whichever is largest (see the module docstring)."""
        now = self.clock()
        return self._clamp(max(self.evidence(), self._held(now), self._climbing(now)))

    def evidence(self) -> float:
        """The windows' verdict alone, without the hold and the climb (with fewer than three
        windows, the largest of them and the serving floor)."""
        now = self.clock()
        while (
            len(self.windows) > _KEEP_WINDOWS
            and now - self.windows[0].at > self.config.jitter_window_s
        ):
            self.windows.popleft()
        windows = self._windows_with_filling()
        if len(windows) >= _MIN_WINDOWS:
            factor = work_percentile([(w.ratio, w.work_ms) for w in windows], 0.9)
        else:
            factor = max([self.serving_floor, *(w.ratio for w in windows)])
        return self._clamp(max(factor, self.core_sharers * self.jitter))

    def _windows_with_filling(self) -> list[Window]:
        """The closed windows and the live one being filled (weighing what it has measured)."""
        windows = list(self.windows)
        if self._filling_measured_ms >= MIN_WINDOW_MS:
            ratio = self._filling_measured_ms / self._filling_predicted_ms
            windows.append(Window(self.clock(), ratio, self._filling_predicted_ms))
        return windows

    def _held(self, now: float) -> float:
        """The slowest live verdict of the last ``factor_recovery_s`` (0: none)."""
        recovery_s = self.config.factor_recovery_s
        while self._verdicts and now - self._verdicts[0][0] > recovery_s:
            self._verdicts.popleft()
        return max((verdict for _, verdict in self._verdicts), default=0.0)

    def _climbing(self, now: float) -> float:
        """The climb's limit now: the factor the load had measured, fallen e-fold every
        ``factor_climb_s`` since the probe that ended it (0: no climb)."""
        if self._climb is None:
            return 0.0
        start, since = self._climb
        climb_s = self.config.factor_climb_s
        return start * math.exp(-(now - since) / climb_s) if climb_s > 0 else 0.0

    def _measured_factor(self, now: float) -> float:
        """What measurement (no prior) says now: the windows' percentile (their largest with
        fewer than three), the hold and the climb."""
        windows = self._windows_with_filling()
        ratios = [(w.ratio, w.work_ms) for w in windows]
        if len(ratios) >= _MIN_WINDOWS:
            evidence = work_percentile(ratios, 0.9)
        else:
            evidence = max((ratio for ratio, _ in ratios), default=0.0)
        return max(evidence, self._held(now), self._climbing(now))

    # -- what it is measured against -----------------------------------------------------------

    @property
    def jitter(self) -> float:
        calibration = self.info.calibration
        return 1.0 if calibration is None else calibration.jitter

    @property
    def unmeasured_factor(self) -> float:
        """The factor assumed before live windows when nothing is remembered
        (``admission.unmeasured_factor``; unset: :data:`UNMEASURED_CPU_FACTOR` for an engine
        on the CPU, 1 elsewhere, where the calibration's jitter is the whole prior)."""
        if self.config.unmeasured_factor is not None:
            return self.config.unmeasured_factor
        return UNMEASURED_CPU_FACTOR if self.info.device.startswith("cpu") else 1.0

    @property
    def remembered_factor(self) -> float | None:
        """The remembered factor as a hint: at most ``admission.remembered_factor_cap`` times
        the unmeasured default, and its distance from that default halved every
        ``admission.remembered_factor_half_life_s`` since it was measured (``None``: none)."""
        if self.remembered is None:
            return None
        default = self.unmeasured_factor
        factor = min(self.remembered.factor, self.config.remembered_factor_cap * default)
        weight = 0.5 ** (self.remembered.age_s / self.config.remembered_factor_half_life_s)
        return default + (factor - default) * weight

    @property
    def serving_floor(self) -> float:
        """What served steps are taken to run over idle (calibration, probe) steps on this
        machine, and what is assumed before three windows: the remembered factor as a hint,
        else the unmeasured default; at least the calibration's jitter."""
        remembered = self.remembered_factor
        return max(self.unmeasured_factor if remembered is None else remembered, self.jitter)

    def wants_probe(self) -> bool:
        """Whether a probe could raise the claim: the factor is above the serving floor."""
        if self.step_model is None:
            return False
        return self.factor() > _PROBE_WANTED_ABOVE * self.serving_floor

    def probe_due(self) -> bool:
        """Whether to ask the (idle) engine for a probe now: one could raise the claim, and
        ``admission.probe_interval_s`` has passed since the last one ran (or was asked for),
        doubled for every probe in a row that did not end a load (at most
        :data:`_PROBE_BACKOFF` times)."""
        return self.clock() >= self._next_probe_at and self.wants_probe()

    def probe_asked(self) -> None:
        """A probe has been asked for now (none more until it has run, or the interval has
        passed without an answer)."""
        self._next_probe_at = self.clock() + self.config.probe_interval_s

    @staticmethod
    def _clamp(factor: float) -> float:
        return min(max(factor, FACTOR_RANGE[0]), FACTOR_RANGE[1])


def work_percentile(windows: list[tuple[float, float]], share: float) -> float:
    """The ratio below which ``share`` of the engine's decode work ran: each window is a
    ``(measured / predicted, predicted ms)`` pair and weighs its predicted work, so a window
    in which the engine barely decoded (one at the start of a wave of streams, or the one
    being filled) moves the percentile only as much as the work it measured. With equal
    work per window this is ``sorted(ratios)[int(share * n)]`` of ``n`` windows."""
    ordered = sorted(windows)
    total = sum(work for _, work in ordered)
    below = 0.0
    for ratio, work in ordered:
        below += work
        if below > share * total * (1 + 1e-9):
            return ratio
    return ordered[-1][0]
