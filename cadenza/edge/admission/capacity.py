"""How many real-time streams one engine replica can hold, and whether it can take one more:
arithmetic over what the engine announced (:class:`EngineInfo`, its chunk plan and targets in
``info.realtime``), what it reports, and the realtime factor
(:mod:`cadenza.edge.admission.realtime_factor`).

Three budgets:

* **KV memory**: the engine's page pool. A stream needs pages for its prompt and its maximum
  output (:meth:`StreamShape.pages`, the formula the engine reserves with), the prompt estimated
  from the text's UTF-8 length; the sum over admitted streams stays within the pool, so the
  engine never has to preempt.
* **Real time**: one step every ``step_period_s`` per stream, at most the step budget (the
  plan's headroom kept free). The calibrated step-time model, times the realtime factor, says
  how many decoding streams fit. Where the engine pads a decode step's keys to the longest
  stream (``EngineInfo.decodes_padded``), ``B + 1`` streams cost ``B + 1`` times the largest
  final context among them; where each stream attends its own context (the fused CPU step), a
  step costs the sum: admission follows every stream's context forward (growing at the frame
  rate, up to ``max_lead_s`` ahead, until its end) and checks the step at each moment the sum
  peaks, just before a stream ends.
* **Prompts**: every admitted prompt, and the new one, must be prefilled in time for its first
  chunk, by deadline (:mod:`cadenza.edge.admission.prefill_schedule`), in the step time the
  decoding streams leave free plus the lead they can lend (``EngineStats.spare_lead_s``).
* **Arrival waves**: the streams admitted within a wave's span, and the new one, may be no
  more than the largest wave the calibration measured holding at the realtime factor now
  (:mod:`cadenza.contract.arrival_wave`): streams that start together decode their chunks in
  phase, and a wave the steady step admits can still miss its second chunks.

``max_streams`` is the smaller of the memory and real-time limits for a *nominal* stream
(``admission.nominal_stream_s`` of audio from a 64-character text), capped by the engine's
``max_num_seqs``; :meth:`CapacityModel.prefill_burst` says how many nominal streams arriving at
once could start on time now. Admission itself uses the streams actually admitted. If delivered
chunks arrive with less than ``admission.slack_close_ms`` of slack, admission closes until
slack has recovered for ``admission.slack_reopen_s``: the measurement wins over the model. An
idle server always admits one stream, however slow its steps look: no one else can be hurt.

No torch here: this runs in the edge.
"""

from __future__ import annotations

import math
import statistics
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from cadenza.config import AdmissionConfig
from cadenza.contract.arrival_wave import wave_limit, wave_span_s
from cadenza.contract.engine_info import EngineInfo
from cadenza.contract.engine_stats import StepReport
from cadenza.contract.messages import Stats
from cadenza.contract.stream_length import NOMINAL_TEXT, stream_length
from cadenza.edge.admission.factor_memory import RememberedFactor
from cadenza.edge.admission.prefill_schedule import Prompt, lateness_s
from cadenza.edge.admission.realtime_factor import RealtimeFactorEstimator

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
    """What the admitted streams hold as admission weighs one more: how many, their KV pages,
    the longest context among them at their end and now (``None``: count every stream as the
    nominal one), and every one of them (the per-stream view; prompts, contexts)."""

    streams: int = 0
    kv_pages: int = 0
    longest_final_context: int | None = None
    longest_context_now: int | None = None
    running: tuple[RunningStream, ...] = ()


class CapacityModel:
    def __init__(
        self,
        info: EngineInfo,
        admission: AdmissionConfig,
        clock: Callable[[], float] = time.monotonic,
        core_sharers: int = 1,
        remembered: RememberedFactor | None = None,
    ) -> None:
        self.info = info
        self.plan = info.realtime
        self.config = admission
        self.clock = clock
        self.step_model = None if info.calibration is None else info.calibration.model
        self.restart_ms_per_stream = self._restart_ms_per_stream()
        self.estimator = RealtimeFactorEstimator(info, admission, clock, core_sharers, remembered)
        self.correction = 1.0
        self.kv_pages_free = info.kv_pages_total
        self.spare_lead_s: float | None = None  # the engine's latest (EngineStats)
        self._recent_steps: deque[float] = deque(maxlen=512)  # ms of steps with decodes
        self._closed_until = 0.0
        # (time, streams the engine was running) per report, over the jitter window
        self._served: deque[tuple[float, int]] = deque(maxlen=1024)
        # predicted step ms of 1, 2, ... nominal streams (:meth:`_nominal_step_ms`)
        self._nominal_steps_ms: list[float] = []
        self._nominal_steps_of: float | None = None  # the nominal_stream_s they were for

    # -- inputs -------------------------------------------------------------------------------

    def observe(self, message: Stats) -> None:
        """Fold one engine ``stats`` message in."""
        self.correction = message.stats.step_correction
        self.kv_pages_free = message.stats.kv_pages_free
        self._served.append((self.clock(), message.stats.num_running))
        self.spare_lead_s = message.stats.spare_lead_s
        report = message.report
        self._recent_steps.extend(1000.0 * s.seconds for s in report.steps if s.decodes > 0)
        self.estimator.observe(report)
        slacks_ms = [1000.0 * s for s in report.chunk_slack_s]
        if slacks_ms and min(slacks_ms) < self.config.slack_close_ms:
            self._closed_until = self.clock() + self.config.slack_reopen_s

    def observe_probe(self, report: StepReport) -> bool:
        """Fold in a probe's steps (:meth:`RealtimeFactorEstimator.observe_probe`)."""
        return self.estimator.observe_probe(report)

    # -- the numbers ----------------------------------------------------------------------------

    @property
    def core_sharers(self) -> int:
        return self.estimator.core_sharers

    def realtime_factor(self) -> float:
        """What step-time predictions are multiplied by before admitting
        (:meth:`RealtimeFactorEstimator.factor`)."""
        return self.estimator.factor()

    @property
    def frame_period_ms(self) -> float:
        return 1000.0 / self.info.frame_rate

    @property
    def step_budget_ms(self) -> float:
        return 1000.0 * self.plan.step_budget_s

    @property
    def nominal_context_tokens(self) -> int:
        """Context each nominal stream costs a decode step: a full nominal stream (prompt plus
        all its output steps), since a step pads every stream's keys to the batch's longest,
        and with streams at every stage the longest is nearly done."""
        shape = self.info.shape
        length = stream_length(self.config.nominal_stream_s, self.info.frame_rate, shape)
        return shape.nominal_prompt_tokens + length.steps

    @property
    def steps_per_second(self) -> float:
        """Decode steps a real-time stream takes per second."""
        return 1.0 / self.plan.step_period_s

    @property
    def lead_steps(self) -> int:
        """How many steps ahead of real time a stream may run (the plan's ``max_lead_s``)."""
        return int(self.plan.max_lead_s * self.steps_per_second)

    def nominal_contexts(self, streams: int) -> int:
        """What a decode step of ``streams`` nominal streams attends, at its most: each at
        the full nominal context where the engine pads to the longest; otherwise the streams
        started evenly one after another (each ``1 / streams`` of a stream's length after the
        previous), just before the oldest ends, every one up to ``lead_steps`` ahead."""
        nominal = self.nominal_context_tokens
        if self.info.decodes_padded:
            return streams * nominal
        prompt = self.info.shape.nominal_prompt_tokens
        steps = nominal - prompt
        return sum(
            min(nominal, prompt + self.lead_steps + round(steps * (1 - k / streams)))
            for k in range(streams)
        )

    def _max_streams_within(self, budget_ms: float, limit: int) -> int:
        """The most nominal streams (up to ``limit``) whose step fits ``budget_ms``."""
        best = 0
        while best < limit and self._nominal_step_ms(best + 1) <= budget_ms:
            best += 1
        return best

    def _nominal_step_ms(self, streams: int) -> float:
        """The predicted step of ``streams`` nominal streams, remembered per calibration and
        nominal stream: every placement asks, many times over in a storm of arrivals. A
        model whose contexts restart (Bark's coarse windows) also prefills its streams'
        share of those prompts in every step."""
        assert self.step_model is not None
        if self._nominal_steps_of != self.config.nominal_stream_s:
            self._nominal_steps_ms, self._nominal_steps_of = [], self.config.nominal_stream_s
        steps_ms = self._nominal_steps_ms
        while len(steps_ms) < streams:
            count = len(steps_ms) + 1
            steps_ms.append(self._step_ms(count, self.nominal_contexts(count)))
        return steps_ms[streams - 1]

    def _restart_ms_per_stream(self) -> float:
        """What each stream adds to every step by prefilling its contexts' prompts, for a
        model whose contexts restart (Bark's coarse windows: the rows per frame spread over a
        frame's steps, each row reading half a context on average); 0 for every other."""
        shape = self.info.shape
        if self.step_model is None or shape.context_rows_per_frame <= 0:
            return 0.0
        row_ms = self.step_model.prefill_ms(1, (shape.max_context_tokens or 0) // 2)
        return shape.context_rows_per_frame / shape.steps_per_frame * row_ms

    def _step_ms(self, streams: int, context: int) -> float:
        """The predicted step of ``streams`` decoding streams attending ``context`` positions
        in all, with their contexts' prompts (:meth:`_restart_ms_per_stream`)."""
        assert self.step_model is not None
        return self.step_model.predict_ms(streams, context) + streams * self.restart_ms_per_stream

    def _max_batch(self, budget_ms: float, context_per_stream: int, limit: int) -> int:
        """The most streams (up to ``limit``) at ``context_per_stream`` whose step fits."""
        best = 0
        while (
            best < limit and self._step_ms(best + 1, (best + 1) * context_per_stream) <= budget_ms
        ):
            best += 1
        return best

    def stream_cost(self, text: str, audio_s: float, prompt_audio_s: float = 0.0) -> StreamCost:
        """What a request holds at most: the pages the engine will reserve for it (exactly
        those for a byte-level tokenizer, fewer for a subword one), its audio seconds, its
        prompt rows and its context at the end."""
        shape = self.info.shape
        prompt_frames = math.ceil(prompt_audio_s * self.info.frame_rate)
        prompt_tokens = shape.max_prompt_tokens(text, prompt_frames)
        length = stream_length(audio_s, self.info.frame_rate, shape)
        return StreamCost(
            shape.pages(prompt_tokens, length.frames),
            audio_s,
            prompt_tokens,
            prompt_tokens + length.steps,
        )

    def realtime_limit(
        self, context_per_stream: int | None = None, factor: float | None = None
    ) -> int:
        """Decoding streams whose step fits the real-time budget at ``factor`` (default: the
        realtime factor now; ``max_num_seqs`` without a calibration), each attending
        ``context_per_stream`` positions (default: nominal streams, :meth:`nominal_contexts`)."""
        limit = self.info.max_num_seqs
        if self.step_model is None:
            return limit
        budget = self.step_budget_ms / (self.realtime_factor() if factor is None else factor)
        if context_per_stream is None:
            return self._max_streams_within(budget, limit)
        return self._max_batch(budget, context_per_stream, limit)

    def realtime_bound(self, context_per_stream: int | None = None) -> int:
        """Decoding streams whose *calibrated* step fits one whole step period: no headroom,
        no realtime factor, no ``max_num_seqs`` cap (0 without a calibration). What the
        engine alone could keep real-time on this device as it was calibrated, the ceiling
        of any claim: :meth:`realtime_limit` is this less the jitter allowances. Each stream
        attends ``context_per_stream`` positions (default: the nominal stream's full
        context; :attr:`short_context_tokens` for the calibration's own short streams)."""
        if self.step_model is None:
            return 0
        period_ms = 1000.0 * self.plan.step_period_s
        if context_per_stream is None:
            return self._max_streams_within(period_ms, _BOUND_LIMIT)
        return self._max_batch(period_ms, context_per_stream, _BOUND_LIMIT)

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

    def kv_limit(self) -> int:
        nominal = self.stream_cost(NOMINAL_TEXT, self.config.nominal_stream_s)
        return self.info.kv_pages_total // max(nominal.kv_pages, 1)

    def max_streams(self, factor: float | None = None) -> int:
        """Streams this replica holds now (at ``factor``; default the realtime factor now,
        within :meth:`claim_ceiling`). The real-time limit counts as at least one: an idle
        server always admits one stream (see :meth:`refusal`)."""
        realtime = self.realtime_limit(factor=factor)
        if factor is None:
            realtime = min(realtime, self.claim_ceiling())
        return max(min(max(realtime, 1), self.kv_limit(), self.info.max_num_seqs), 0)

    def served_peak(self) -> int:
        """The most streams the engine reported running at once over the jitter window."""
        now = self.clock()
        while self._served and now - self._served[0][0] > self.config.jitter_window_s:
            self._served.popleft()
        return max((streams for _, streams in self._served), default=0)

    def claim_ceiling(self) -> int:
        """How far evidence may lift the claim: the claim at the serving floor (the prior
        the claim starts from), or ``admission.claim_growth`` times the most streams served
        at once lately, whichever is more. A factor measured at ``B`` streams, on cores the
        edge and the clients share with a load that grows with the streams, vouches for a
        little more than ``B``, not for all a faster factor extrapolates to: the claim rises
        a step at a time, each step measured before the next (additive increase; a slower
        verdict still cuts it at once)."""
        floor = self.realtime_limit(factor=self.estimator.serving_floor)
        return max(floor, math.ceil(self.config.claim_growth * self.served_peak()))

    @property
    def admission_open(self) -> bool:
        return self.clock() >= self._closed_until

    def refusal(self, load: AdmittedLoad, cost: StreamCost) -> str | None:
        """Why one more stream of ``cost`` cannot start next to ``load`` (``None``: it can):
        ``deadlines_slipping``, ``realtime_budget``, ``prefill_budget``, ``arrival_wave``,
        ``max_streams`` or ``kv_memory``."""
        active = load.streams
        if active > 0 and not self.admission_open:
            return "deadlines_slipping"
        if active > 0 and not self._realtime_fits(load, cost):
            return "realtime_budget"
        if active > 0 and self.step_model is not None and active + 1 > self.claim_ceiling():
            return "realtime_budget"  # more than the load has vouched for so far
        if active > 0 and self.prefill_lateness_s(load, cost) > 0:
            return "prefill_budget"
        if active > 0 and self.wave_wait_s(load) > 0:
            return "arrival_wave"
        if active + 1 > self.info.max_num_seqs:
            return "max_streams"
        if load.kv_pages + cost.kv_pages > self.info.kv_pages_total:
            return "kv_memory"
        return None

    def _realtime_fits(self, load: AdmittedLoad, cost: StreamCost) -> bool:
        """Real time, judged at the end of every admitted stream: padded, ``B + 1`` streams at
        the largest final context; otherwise each stream followed to its end
        (:meth:`_peaks_fit`)."""
        if self.step_model is None:
            return True  # without a calibration: memory and max_num_seqs alone
        if self.info.decodes_padded or not load.running:
            nominal = self.nominal_context_tokens
            final = (
                nominal
                if load.longest_final_context is None
                else max(load.longest_final_context, cost.final_context)
            )
            return load.streams + 1 <= self.realtime_limit(final)
        return self._peaks_fit(load.running, cost)

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
        lead = self.lead_steps
        by_end = sorted(zip(ends, streams, strict=True), key=lambda pair: pair[0])
        for first, (moment, _) in enumerate(by_end):
            if first > 0 and moment == by_end[first - 1][0]:
                continue  # that moment was checked with every stream ending at it alive
            alive = by_end[first:]  # those ending at ``moment`` or later
            # _context_in of each, inlined: a storm of arrivals asks this many times over
            context = sum(
                min(s.final_context, s.prompt_tokens + lead + int((s.age_s + moment) * rate))
                for _, s in alive
            )
            if self._step_ms(len(alive), context) > budget:
                return False
        return True

    def _context_in(self, stream: RunningStream, seconds: float) -> int:
        """The most positions ``stream`` attends ``seconds`` from now: real-time progress
        since it was admitted, plus the lead it may run ahead, up to its final context."""
        progress = int((stream.age_s + seconds) * self.steps_per_second)
        return min(stream.final_context, stream.prompt_tokens + self.lead_steps + progress)

    # -- prompts --------------------------------------------------------------------------------

    def prefill_lateness_s(self, load: AdmittedLoad, cost: StreamCost) -> float:
        """How late a new stream of ``cost`` would make the latest prompt it is to blame for
        (its own, or an admitted one that was on time without it), prompts prefilled by
        deadline in the step time the decoding streams leave (:mod:`prefill_schedule`); 0 or
        less: it fits. Waiting makes a held stream's lateness shrink by about the wait."""
        if self.step_model is None:
            return 0.0
        now = self.clock()
        factor = self.realtime_factor()
        decoding = [s for s in load.running if s.age_s >= self.plan.ttfa_target_s]
        rate = self._prefill_rate(decoding, factor)
        first_chunk_s = self._first_chunk_s(load.streams + 1, factor)
        pending = [
            self._prompt(now - s.age_s, s.prompt_tokens, factor, first_chunk_s)
            for s in load.running
            if s.age_s < self.plan.ttfa_target_s + self._allowance_s(s.prompt_tokens)
        ]
        new = self._prompt(now, cost.prompt_tokens, factor, first_chunk_s)
        lent_ms = 0.0
        if decoding and self.spare_lead_s is not None:
            lent_ms = 1000.0 * min(self.spare_lead_s, self.plan.ttfa_target_s)
        return lateness_s(pending, new, rate, lent_ms, now)

    # -- arrival waves ---------------------------------------------------------------------------

    def wave_factor(self) -> float:
        """The factor waves are held to: the realtime factor times ``admission.wave_headroom``
        (a wave's connection storm loads the cores beyond what steady steps measure)."""
        return self.realtime_factor() * self.config.wave_headroom

    def wave_limit(self, factor: float | None = None) -> int | None:
        """The most streams that may start together at ``factor`` (default:
        :meth:`wave_factor`), from the calibration's measured waves; ``None`` where none
        were."""
        calibration = self.info.calibration
        if calibration is None:
            return None
        return wave_limit(calibration.waves, self.wave_factor() if factor is None else factor)

    def young_ages_s(self, load: AdmittedLoad, factor: float | None = None) -> list[float]:
        """The ages of the admitted streams still within a wave's span (at ``factor``): the
        streams a new arrival would start together with."""
        calibration = self.info.calibration
        if calibration is None or not calibration.waves:
            return []
        factor = self.wave_factor() if factor is None else factor
        span_s = wave_span_s(calibration.waves, load.streams + 1, factor)
        return [s.age_s for s in load.running if s.age_s < span_s]

    def wave_wait_s(self, load: AdmittedLoad) -> float:
        """How long until one more stream may start with the streams of ``load`` that are
        still young (0: at once): until enough of them have aged past the wave's span."""
        factor = self.wave_factor()
        limit = self.wave_limit(factor)
        if limit is None:
            return 0.0
        young = sorted(self.young_ages_s(load, factor), reverse=True)
        excess = len(young) + 1 - limit
        if excess <= 0:
            return 0.0
        assert self.info.calibration is not None
        span_s = wave_span_s(self.info.calibration.waves, load.streams + 1, factor)
        return max(span_s - young[excess - 1], 1e-3)

    def prefill_burst(self, load: AdmittedLoad) -> int:
        """How many nominal streams arriving together now would all start on time next to
        ``load`` (each prompt by its deadline, within the arrival-wave limit less the young
        streams; at most what the real-time and memory limits leave, and at least one on an
        idle replica)."""
        room = max(self.max_streams() - load.streams, 0)
        wave = self.wave_limit()
        if wave is not None and load.streams > 0:
            room = min(room, max(wave - len(self.young_ages_s(load)), 0))
        elif wave is not None:
            room = min(room, wave)
        cost = self.stream_cost(NOMINAL_TEXT, self.config.nominal_stream_s)
        admitted = load
        burst = 0
        now_age = 0.0
        while burst < room:
            if admitted.streams > 0 and self.prefill_lateness_s(admitted, cost) > 0:
                break
            burst += 1
            arrival = RunningStream(now_age, cost.prompt_tokens, cost.final_context)
            admitted = AdmittedLoad(
                admitted.streams + 1,
                admitted.kv_pages + cost.kv_pages,
                admitted.longest_final_context,
                admitted.longest_context_now,
                (*admitted.running, arrival),
            )
        return burst

    def _prompt(self, released_s: float, rows: int, factor: float, first_chunk_s: float) -> Prompt:
        """A prompt of ``rows`` admitted at ``released_s``: its prefill at ``factor``, due
        when its first chunk is due less the first chunk's own steps."""
        assert self.step_model is not None
        due_after = self.plan.first_chunk_due_after_s(rows, self.step_model)
        work_ms = factor * self.step_model.prefill_ms(rows)
        return Prompt(released_s, work_ms, released_s + due_after - first_chunk_s)

    def _allowance_s(self, rows: int) -> float:
        """How much later than the TTFA target a prompt of ``rows`` has its first chunk due."""
        return self.plan.first_chunk_due_after_s(rows, self.step_model) - self.plan.ttfa_target_s

    def _prefill_rate(self, decoding: list[RunningStream], factor: float) -> float:
        """Prefill work per unit of wall time: all of it while nothing decodes (the engine
        prefills back to back), else the share of each step period that the ``decoding``
        streams' step at ``factor`` leaves within the step budget."""
        if not decoding:
            return 1.0
        assert self.step_model is not None
        context = sum(self._context_in(s, 0.0) for s in decoding)
        if self.info.decodes_padded:
            context = len(decoding) * max(self._context_in(s, 0.0) for s in decoding)
        step_ms = factor * self._step_ms(len(decoding), context)
        spare_ms = max(self.step_budget_ms - step_ms, 0.0)
        return spare_ms / (1000.0 * self.plan.step_period_s)

    def _first_chunk_s(self, streams: int, factor: float) -> float:
        """What producing a first chunk takes: its steps, each as long as ``streams`` nominal
        streams' step at ``factor``, at most the step budget."""
        assert self.step_model is not None
        step_ms = factor * self._step_ms(streams, streams * self.short_context_tokens)
        return self.plan.first_chunk_steps * min(step_ms, self.step_budget_ms) / 1000.0

    # -- what /v1/capacity shows ----------------------------------------------------------------

    def step_ms_p50(self, active: int) -> float:
        """Median of recent steps that decoded; the model's prediction before any."""
        if self._recent_steps:
            return statistics.median(self._recent_steps)
        if self.step_model is None:
            return 0.0
        streams = max(active, 1)
        predicted = self._step_ms(streams, self.nominal_contexts(streams))
        return predicted * self.realtime_factor()

    def rtf_headroom(self, active: int) -> float:
        """``1 - step time / step period``: the share of real time still free (negative: the
        engine is slower than real time)."""
        return 1.0 - self.step_ms_p50(active) / (1000.0 * self.plan.step_period_s)
