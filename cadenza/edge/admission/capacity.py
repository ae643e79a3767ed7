"""How many real-time streams this server can hold, from measured memory and measured steps.

Two budgets, both from the engine (its ``ready`` info and its ``stats`` reports):

* **KV memory**: the engine's page pool (``KV_budget`` already net of weights, see
  ``engine.kv_cache_memory_*``). A stream needs pages for its prompt and its maximum output,
  :meth:`StreamShape.pages` (the formula the engine reserves with), with the prompt estimated
  from the text's UTF-8 length; admission keeps the sum over admitted streams within the pool,
  so the engine never has to preempt.
* **Real time**: one codec frame every ``1 / frame_rate`` seconds per stream, i.e. a step of at
  most ``frame period / steps_per_frame * (1 - headroom)``. The calibrated step-time model says
  how many decoding streams fit that step, with every prediction scaled by the *realtime
  factor*: the 90th percentile of how much slower than predicted the engine's steps actually
  ran, per window of ``engine.max_lead_ms`` (a shorter slow spell is absorbed by the lead the
  streams run ahead of their listeners), each window weighing the decode work it measured
  (one in which the engine barely decoded, as at the start of a wave of new streams, says
  little about the speed of a full batch), over the last ``admission.jitter_window_s`` (before
  any report, the calibration's own measured jitter), and never less than the jitter times
  the engine replicas that share this one's CPU cores (:mod:`cadenza.contract.cpu_replicas`:
  any of them may be busy). A slower verdict counts at once, a faster one only after
  ``admission.factor_recovery_s``: under load the machine's speed swings by more than one
  window shows, and a claim that rose on a fast spell would admit streams the next slow one
  cannot keep on time. Two kinds of step time are not held against the model: steps
  right after the engine rested (cold caches; it rests only while every stream is far ahead
  of its listener), and the lumps of the codec, which decodes chunks of several frames on a
  few steps: each step counts its frames' share of the codec's recent time instead, as the
  calibration's mean step times do. Admitting against a high percentile rather than the mean
  is what lets the promise survive a noisy host: a stream is admitted only if ``B + 1``
  streams still fit at that percentile.
* **What admitting costs**: a new stream's prompt has to be prefilled within its TTFA target
  less the time its first chunk takes at the step budget, together with the prompts of the
  streams admitted just before it that may still be prefilling, in the spare time of the
  steps the running streams leave plus the lead they can lend (the engine reports how far
  ahead of their playout reserves its running streams are, ``EngineStats.spare_lead_s``; its
  deadline policy prefills past the step budget by at most that). A stream whose prompt
  would not fit waits (or is refused) rather than making a wave of new prompts eat the
  running streams' slack.

``max_streams`` is the smaller of the two for a *nominal* stream (``admission.nominal_stream_s``
of audio), capped by the engine's ``max_num_seqs``. Admission itself uses the streams
actually admitted. Where the engine pads a decode step's keys to the longest stream
(``EngineInfo.decodes_padded``), ``B + 1`` streams cost ``B + 1`` times the largest final
context among them and the new one, and the claim counts every nominal stream at its full
context. Where each stream attends only its own context (the fused CPU decode), a step costs
the sum of the contexts: admission follows every admitted stream's context forward (growing at
the frame rate, up to ``engine.max_lead_ms`` ahead, until its final context and its end) and
checks the step at each moment the sum peaks, just before a stream ends; the claim counts
nominal streams started evenly one after another, at that peak.
If delivered chunks start arriving with less slack than ``admission.slack_close_ms`` before
their deadline, admission closes (no new stream until slack has recovered for
``admission.slack_reopen_s``): the measurement wins over the model. An idle server always
admits one stream, however slow its steps look: no one else can be hurt by it.

No torch here: this runs in the edge.
"""

from __future__ import annotations

import math
import statistics
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from cadenza.config import CHUNK_FRAME_RATE, AdmissionConfig, EngineConfig
from cadenza.contract.engine_info import EngineInfo
from cadenza.contract.engine_stats import STATS_INTERVAL_S
from cadenza.contract.messages import Stats
from cadenza.contract.step_time_model import step_budget_s
from cadenza.contract.stream_length import frames_for_duration

_NOMINAL_TEXT = "x" * 64  # the text of the nominal stream max_streams is quoted for
_MIN_REPORT_MS = 50.0  # a report with less decoding than this says little about speed
# A step after the engine rested this long starts with cold caches and runs slower than the
# calibration's back-to-back steps; the engine rests only while every stream is far ahead of
# its listener, so such steps threaten no deadline, and they do not count against the model.
_REST_S = 0.002
_MIN_WINDOWS = 3  # live windows for a percentile (fewer: the worst of them and the jitter)
_KEEP_WINDOWS = 10  # the latest windows stand, however old, until newer ones replace them
_FACTOR_RANGE = (0.5, 20.0)
# What a CPU engine's served steps are assumed to run against its calibration before anything
# is measured or remembered: the edge and the clients share its cores (1.1-1.7 measured on the
# 2-core development machine, docs/benchmarks.md). Erring slow is the safe side: live windows
# replace it within seconds of load, and a claim that starts low only rises.
_UNMEASURED_CPU_FACTOR = 1.4
_MIN_PREFILL_SHARE_OF_TTFA = 0.25  # a prompt always has this much of its TTFA target
_BOUND_LIMIT = 1024  # streams the real-time bound counts up to


@dataclass(frozen=True)
class StreamCost:
    """What one admitted stream holds: KV pages reserved, seconds of audio it may produce,
    the prompt rows the engine prefills before its first frame, and the KV positions it holds
    at its end (what a decode step padded to it attends per stream); upper estimates."""

    kv_pages: int
    audio_s: float
    prompt_tokens: int = 0
    final_context: int = 0


@dataclass(frozen=True)
class RunningStream:
    """One admitted stream as admission follows it: seconds since it was admitted, its prompt
    rows and its context at its end."""

    age_s: float
    prompt_tokens: int
    final_context: int


@dataclass(frozen=True)
class AdmittedLoad:
    """What the admitted streams hold as admission weighs one more: how many, their KV
    pages, the prompt rows of those whose prefill is not expected done yet (each prompt
    after those admitted before it, :meth:`CapacityModel.prefill_s`, and never past a TTFA
    target after admission), and the longest context among them at their end and now
    (``None``: count every stream as the nominal one)."""

    streams: int = 0
    kv_pages: int = 0
    prefilling_tokens: int = 0
    longest_final_context: int | None = None
    longest_context_now: int | None = None
    prefilling_streams: int = 0  # those whose prefill is not expected done yet
    running: tuple[RunningStream, ...] = ()  # every admitted stream (the per-stream view)


class CapacityModel:
    def __init__(
        self,
        info: EngineInfo,
        engine: EngineConfig,
        admission: AdmissionConfig,
        clock: Callable[[], float] = time.monotonic,
        core_sharers: int = 1,
        remembered_factor: float | None = None,
    ) -> None:
        self.info = info
        self.core_sharers = core_sharers
        # the last server's live factor (factor_memory.py), until this one has its own
        self.remembered_factor = remembered_factor
        self.engine_config = engine
        self.config = admission
        self.clock = clock
        self.step_model = None if info.calibration is None else info.calibration.model
        self.correction = 1.0
        self.kv_pages_free = info.kv_pages_total
        self.spare_lead_s: float | None = None  # the engine's latest (EngineStats)
        self._recent_steps: deque[float] = deque(maxlen=512)  # ms of steps with decodes
        # (time, measured / predicted, predicted ms) per window; pruned by realtime_factor,
        # bounded anyway
        self._ratios: deque[tuple[float, float, float]] = deque(maxlen=1024)
        # (time, the percentile verdict) at each window's close, over factor_recovery_s
        self._verdicts: deque[tuple[float, float]] = deque(maxlen=1024)
        # the window being filled: measured and predicted decode ms, reports in it
        self._window_measured_ms = self._window_predicted_ms = 0.0
        self._window_reports = 0
        # (time, codec seconds, stream-frames) per report, over the jitter window
        self._codec: deque[tuple[float, float, int]] = deque(maxlen=1024)
        self._closed_until = 0.0

    # -- inputs -------------------------------------------------------------------------------

    def observe(self, message: Stats) -> None:
        """Fold one engine ``stats`` message in."""
        self.correction = message.stats.step_correction
        self.kv_pages_free = message.stats.kv_pages_free
        self.spare_lead_s = message.stats.spare_lead_s
        report = message.report
        now = self.clock()
        self._codec.append((now, report.codec_s, report.codec_frames))
        codec_ms_per_frame = self._codec_ms_per_frame(now)
        measured = predicted = 0.0
        for step in report.steps:
            if step.decodes > 0:
                self._recent_steps.append(1000.0 * step.seconds)
            counted = step.decodes > 0 and step.tokens <= 2 * step.decodes
            if self.step_model is not None and counted and step.rested_s <= _REST_S:
                # The codec's chunks land on a few steps: each step is counted with its
                # frames' share of the codec's recent time instead (the calibration's step
                # times amortise the codec the same way).
                measured += 1000.0 * step.seconds
                if codec_ms_per_frame is not None:
                    frames = step.decodes / self.info.shape.steps_per_frame
                    measured += frames * codec_ms_per_frame - 1000.0 * step.codec_s
                predicted += self.step_model.predict_ms(step.tokens, step.context_tokens)
        if predicted > 0:
            self._window_measured_ms += measured
            self._window_predicted_ms += predicted
            self._window_reports += 1
            if (
                self._window_reports * STATS_INTERVAL_S >= self.ratio_window_s
                and self._window_measured_ms >= _MIN_REPORT_MS
            ):
                ratio = self._window_measured_ms / self._window_predicted_ms
                self._ratios.append((now, ratio, self._window_predicted_ms))
                self._window_measured_ms = self._window_predicted_ms = 0.0
                self._window_reports = 0
                if self.config.factor_recovery_s > 0 and self.has_live_factor():
                    self._verdicts.append((now, self._percentile_factor(now)))
        slacks_ms = [1000.0 * s for s in message.report.chunk_slack_s]
        if slacks_ms and min(slacks_ms) < self.config.slack_close_ms:
            self._closed_until = self.clock() + self.config.slack_reopen_s

    def _codec_ms_per_frame(self, now: float) -> float | None:
        """The codec's time per stream-frame over the jitter window (``None`` before it has
        decoded anything)."""
        while self._codec and now - self._codec[0][0] > self.config.jitter_window_s:
            self._codec.popleft()
        frames = sum(f for _, _, f in self._codec)
        return 1000.0 * sum(s for _, s, _ in self._codec) / frames if frames else None

    # -- the numbers ----------------------------------------------------------------------------

    @property
    def frame_period_ms(self) -> float:
        return 1000.0 / self.info.frame_rate

    @property
    def step_budget_ms(self) -> float:
        headroom = self.engine_config.realtime_headroom
        return 1000.0 * step_budget_s(
            self.info.frame_period_s, self.info.shape.steps_per_frame, headroom
        )

    @property
    def nominal_context_tokens(self) -> int:
        """Context each nominal stream costs a decode step: a full nominal stream (prompt plus
        all its output steps), since a step pads every stream's keys to the batch's longest,
        and with streams at every stage the longest is nearly done."""
        frames = frames_for_duration(self.config.nominal_stream_s, self.info.frame_rate)
        shape = self.info.shape
        return shape.max_prompt_tokens(_NOMINAL_TEXT) + shape.steps_for_frames(frames)

    @property
    def steps_per_second(self) -> float:
        """Decode steps a real-time stream takes per second."""
        return self.info.frame_rate * self.info.shape.steps_per_frame

    @property
    def lead_steps(self) -> int:
        """How many steps ahead of real time a stream may run (``engine.max_lead_ms``)."""
        return int(self.engine_config.max_lead_ms / 1000.0 * self.steps_per_second)

    def nominal_contexts(self, streams: int) -> int:
        """What a decode step of ``streams`` nominal streams attends, at its most: each at
        the full nominal context where the engine pads to the longest; otherwise the streams
        started evenly one after another (each ``1 / streams`` of a stream's length after the
        previous), just before the oldest ends, every one up to ``lead_steps`` ahead."""
        nominal = self.nominal_context_tokens
        if self.info.decodes_padded:
            return streams * nominal
        prompt = self.info.shape.max_prompt_tokens(_NOMINAL_TEXT)
        steps = nominal - prompt
        return sum(
            min(nominal, prompt + self.lead_steps + round(steps * (1 - k / streams)))
            for k in range(streams)
        )

    def _max_streams_within(self, budget_ms: float, limit: int) -> int:
        """The most nominal streams (up to ``limit``) whose step fits ``budget_ms``."""
        assert self.step_model is not None
        best = 0
        for streams in range(1, limit + 1):
            if self.step_model.predict_ms(streams, self.nominal_contexts(streams)) > budget_ms:
                break
            best = streams
        return best

    def stream_cost(self, text: str, audio_s: float, prompt_audio_s: float = 0.0) -> StreamCost:
        """What a request holds at most: the pages the engine will reserve for it (exactly
        those for a byte-level tokenizer, fewer for a subword one), its audio seconds, its
        prompt rows and its context at the end."""
        shape = self.info.shape
        prompt_frames = math.ceil(prompt_audio_s * self.info.frame_rate)
        prompt_tokens = shape.max_prompt_tokens(text, prompt_frames)
        frames = frames_for_duration(audio_s, self.info.frame_rate)
        return StreamCost(
            shape.pages(prompt_tokens, frames),
            audio_s,
            prompt_tokens,
            prompt_tokens + shape.steps_for_frames(frames),
        )

    def has_live_factor(self) -> bool:
        """Whether the realtime factor now comes from live windows alone (enough of them)."""
        return len(self._ratios) >= _MIN_WINDOWS

    @property
    def ratio_window_s(self) -> float:
        """How much engine time one measured/predicted ratio sums (in reports of
        ``STATS_INTERVAL_S``): the engine's lead cap (``engine.max_lead_ms``), at least one
        report and at most a fifth of the jitter window. A slower spell shorter than the
        lead is absorbed by the lead its streams run ahead of their listeners; what admission
        must not overrun is the engine's speed over the lead."""
        lead_s = self.engine_config.max_lead_ms / 1000.0
        return min(max(lead_s, STATS_INTERVAL_S), self.config.jitter_window_s / 5)

    def realtime_factor(self) -> float:
        """What step-time predictions are multiplied by before admitting: the 90th percentile
        of measured over predicted time, summed over windows of :attr:`ratio_window_s` (the
        one being filled included), each weighing its predicted decode work
        (:func:`_work_percentile`), over the last ``jitter_window_s`` (and at least the
        latest windows, however old: an idle server keeps its last verdict rather than
        trusting a calibration the machine may have drifted from); with fewer than three,
        the largest of them, the calibration's jitter and the factor the last server
        measured (``remembered_factor``; :attr:`unmeasured_factor` if none); at least
        ``core_sharers`` times the jitter; and at least every live verdict of the last
        ``factor_recovery_s`` (taken as each window closed, once there are three): slower
        news counts at once, faster news once it has held that long."""
        now = self.clock()
        factor = self._percentile_factor(now)
        recovery_s = self.config.factor_recovery_s
        if recovery_s <= 0:
            return factor
        while self._verdicts and now - self._verdicts[0][0] > recovery_s:
            self._verdicts.popleft()
        return max([factor, *(verdict for _, verdict in self._verdicts)])

    def _percentile_factor(self, now: float) -> float:
        """:meth:`realtime_factor` from the windows alone, without the recovery delay."""
        while (
            len(self._ratios) > _KEEP_WINDOWS
            and now - self._ratios[0][0] > self.config.jitter_window_s
        ):
            self._ratios.popleft()
        calibration = self.info.calibration
        jitter = 1.0 if calibration is None else calibration.jitter
        windows = [(ratio, work) for _, ratio, work in self._ratios]
        if self._window_measured_ms >= _MIN_REPORT_MS:
            filling = self._window_measured_ms / self._window_predicted_ms
            windows.append((filling, self._window_predicted_ms))
        if len(windows) >= _MIN_WINDOWS:
            factor = _work_percentile(windows, 0.9)
        else:
            ratios = [ratio for ratio, _ in windows]
            factor = max([jitter, *ratios, self.remembered_factor or self.unmeasured_factor])
        factor = max(factor, self.core_sharers * jitter)
        return min(max(factor, _FACTOR_RANGE[0]), _FACTOR_RANGE[1])

    @property
    def unmeasured_factor(self) -> float:
        """The factor assumed before live windows when nothing is remembered
        (``admission.unmeasured_factor``; unset: :data:`_UNMEASURED_CPU_FACTOR` for an engine
        on the CPU, 1 elsewhere, where the calibration's jitter is the whole prior)."""
        if self.config.unmeasured_factor is not None:
            return self.config.unmeasured_factor
        return _UNMEASURED_CPU_FACTOR if self.info.device.startswith("cpu") else 1.0

    def realtime_limit(self, context_per_stream: int | None = None) -> int:
        """Decoding streams whose step fits the real-time budget at the realtime factor
        (``max_num_seqs`` without a calibration), each attending ``context_per_stream``
        positions (default: nominal streams, :meth:`nominal_contexts`)."""
        limit = self.info.max_num_seqs
        if self.step_model is None:
            return limit
        budget = self.step_budget_ms / self.realtime_factor()
        if context_per_stream is None:
            return self._max_streams_within(budget, limit)
        return self.step_model.max_batch(budget, context_per_stream, limit)

    def realtime_bound(self, context_per_stream: int | None = None) -> int:
        """Decoding streams whose *calibrated* step fits one whole frame period: no headroom,
        no realtime factor, no ``max_num_seqs`` cap (0 without a calibration). What the
        engine alone could keep real-time on this device as it was calibrated, the ceiling
        of any claim: :meth:`realtime_limit` is this less the jitter allowances. Each stream
        attends ``context_per_stream`` positions (default: the nominal stream's full
        context; :attr:`short_context_tokens` for the calibration's own short streams)."""
        if self.step_model is None:
            return 0
        period_ms = self.frame_period_ms / self.info.shape.steps_per_frame
        if context_per_stream is None:
            return self._max_streams_within(period_ms, _BOUND_LIMIT)
        return self.step_model.max_batch(period_ms, context_per_stream, _BOUND_LIMIT)

    def bounds(self) -> dict[str, float] | None:
        """This replica's share of the machine's bounds, none of them admission's own figure
        (``None`` without a calibration): the calibration's saturated throughput in streams
        (``throughput_streams``, ``long_context_throughput_streams``) and the real-time bound
        for nominal and for short streams (``realtime_streams``,
        ``realtime_short_context_streams``), each divided by the replicas sharing its cores
        (every one of them measured what all the cores can do)."""
        calibration = self.info.calibration
        if calibration is None:
            return None
        share = 1.0 / self.core_sharers
        return {
            "throughput_streams": share * calibration.throughput_streams,
            "long_context_throughput_streams": share * calibration.long_context_throughput_streams,
            "realtime_streams": share * self.realtime_bound(),
            "realtime_short_context_streams": share
            * self.realtime_bound(self.short_context_tokens),
        }

    @property
    def short_context_tokens(self) -> int:
        """Context per stream of the calibration's decode points (short prompts, early in
        their streams); 0 without them."""
        points = () if self.step_model is None else self.step_model.decode_points
        return round(points[0][1] / points[0][0]) if points else 0

    def prefill_s(self, prompt_tokens: int) -> float:
        """Seconds a prompt of ``prompt_tokens`` rows takes to prefill once the engine is on
        it: its rows at the realtime factor, plus the step it lands in (a frame period's
        step without a calibration)."""
        step_s = self.frame_period_ms / self.info.shape.steps_per_frame / 1000.0
        if self.step_model is None:
            return step_s
        return self.realtime_factor() * self.step_model.prefill_ms(prompt_tokens) / 1000 + step_s

    @property
    def prefill_window_ms(self) -> float:
        """How long a new stream's prompt may take to prefill: its TTFA target less the time
        its first chunk's frames take at the step budget (``engine.first_chunk_frames``, a
        duration), at least a quarter of the target."""
        config = self.engine_config
        first_chunk_ms = (
            1000.0 * config.first_chunk_frames / CHUNK_FRAME_RATE * (1.0 - config.realtime_headroom)
        )
        target_ms = config.ttfa_target_ms
        return max(target_ms - first_chunk_ms, _MIN_PREFILL_SHARE_OF_TTFA * target_ms)

    def prefill_fits(self, decoding: int, prompt_tokens: int, decoding_context: int) -> bool:
        """Whether ``prompt_tokens`` prompt rows (the new stream's and those of streams
        admitted just before it) can be prefilled within :attr:`prefill_window_ms`: in the step
        time ``decoding`` streams attending ``decoding_context`` positions in all (now) leave
        free, plus the lead the running streams can lend (the engine's latest
        ``spare_lead_s``: it prefills past the step budget while every stream has that much
        to spare beyond its playout reserve). A step with prefill rows pads its decodes: the
        caller counts them padded."""
        if self.step_model is None:
            return True
        factor = self.realtime_factor()
        step_ms = 0.0
        if decoding > 0:
            step_ms = factor * self.step_model.predict_ms(decoding, decoding_context)
        spare_ms = max(self.step_budget_ms - step_ms, 0.0)
        window_ms = self.prefill_window_ms
        steps = window_ms / (self.frame_period_ms / self.info.shape.steps_per_frame)
        lent_ms = 0.0
        if decoding > 0 and self.spare_lead_s is not None:
            lent_ms = min(1000.0 * self.spare_lead_s, window_ms)
        needed_ms = factor * self.step_model.prefill_ms(prompt_tokens)
        return needed_ms <= spare_ms * steps + lent_ms

    def kv_limit(self) -> int:
        nominal = self.stream_cost(_NOMINAL_TEXT, self.config.nominal_stream_s)
        return self.info.kv_pages_total // max(nominal.kv_pages, 1)

    def max_streams(self) -> int:
        """Streams this server holds now. The real-time limit counts as at least one: an
        idle server always admits one stream (see :meth:`refusal`)."""
        realtime = max(self.realtime_limit(), 1)
        return max(min(realtime, self.kv_limit(), self.info.max_num_seqs), 0)

    @property
    def admission_open(self) -> bool:
        return self.clock() >= self._closed_until

    def refusal(self, load: AdmittedLoad, cost: StreamCost) -> str | None:
        """Why one more stream of ``cost`` cannot start next to ``load`` (``None``: it can).

        Real time is judged at the end of every admitted stream (a decode step pads to the
        longest, so ``B + 1`` streams at the largest final context); the new prompt's prefill,
        with the prompts admitted just before it, against the step time left by the streams
        already decoding, at their contexts now."""
        active = load.streams
        nominal = self.nominal_context_tokens
        final = (
            nominal
            if load.longest_final_context is None
            else max(load.longest_final_context, cost.final_context)
        )
        now = nominal if load.longest_context_now is None else load.longest_context_now
        now = max(now, cost.prompt_tokens)
        if active > 0 and not self.admission_open:
            return "deadlines_slipping"
        if active > 0:
            if self.info.decodes_padded or not load.running:
                if active + 1 > self.realtime_limit(final):
                    return "realtime_budget"
            elif self.step_model is not None and not self._peaks_fit(load.running, cost):
                return "realtime_budget"
        prompt_tokens = load.prefilling_tokens + cost.prompt_tokens
        decoding = active - load.prefilling_streams
        decoding_context = decoding * now
        if not self.info.decodes_padded and load.running:
            decoding_context = sum(self._context_in(s, 0.0) for s in load.running)
        if active > 0 and not self.prefill_fits(decoding, prompt_tokens, decoding_context):
            return "prefill_budget"
        if active + 1 > self.info.max_num_seqs:
            return "max_streams"
        if load.kv_pages + cost.kv_pages > self.info.kv_pages_total:
            return "kv_memory"
        return None

    def _peaks_fit(self, running: tuple[RunningStream, ...], cost: StreamCost) -> bool:
        """Whether every decode step from now on fits the real-time budget at the realtime
        factor, with ``running`` and a new stream of ``cost``, each attending its own context
        (an engine that does not pad): contexts grow at the frame rate (up to ``lead_steps``
        ahead) to their final ones, and a stream ends once real time has reached its end;
        the sum peaks just before each end, where it is checked."""
        assert self.step_model is not None
        rate = self.steps_per_second
        streams = [*running, RunningStream(0.0, cost.prompt_tokens, cost.final_context)]
        ends = [max((s.final_context - s.prompt_tokens) / rate - s.age_s, 0.0) for s in streams]
        budget = self.step_budget_ms / self.realtime_factor()
        for moment in sorted(set(ends)):
            alive = [s for s, end in zip(streams, ends, strict=True) if end >= moment]
            context = sum(self._context_in(s, moment) for s in alive)
            if self.step_model.predict_ms(len(alive), context) > budget:
                return False
        return True

    def _context_in(self, stream: RunningStream, seconds: float) -> int:
        """The most positions ``stream`` attends ``seconds`` from now: real-time progress
        since it was admitted, plus the lead it may run ahead, up to its final context."""
        progress = int((stream.age_s + seconds) * self.steps_per_second)
        return min(stream.final_context, stream.prompt_tokens + self.lead_steps + progress)

    def step_ms_p50(self, active: int) -> float:
        """Median of recent steps that decoded; the model's prediction before any."""
        if self._recent_steps:
            return statistics.median(self._recent_steps)
        if self.step_model is None:
            return 0.0
        streams = max(active, 1)
        predicted = self.step_model.predict_ms(streams, self.nominal_contexts(streams))
        return predicted * self.realtime_factor()

    def rtf_headroom(self, active: int) -> float:
        """``1 - step time / step budget at zero headroom``: the share of real time still free
        (negative: the engine is slower than real time)."""
        step_ms = self.step_ms_p50(active)
        return 1.0 - step_ms * self.info.shape.steps_per_frame / self.frame_period_ms


def _work_percentile(windows: list[tuple[float, float]], share: float) -> float:
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
