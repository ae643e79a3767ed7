"""Start-up calibration: measure what a step costs on this device, fit a :class:`StepTimeModel`.

The sweep runs the real engine on synthetic streams through its ordinary interface (requests
in, steps, step reports out), so the measurement includes everything a live step does: the
forward pass, sampling, and the streaming codec decode amortised over the chunk. For each batch
size ``B`` (``calibration.batch_sizes``, up to ``max_num_seqs`` and the KV pages
available; the smallest runs once first, unmeasured, to pay one-off costs): start ``B`` streams
with short prompts, their arrivals spread over one chunk period as live arrivals are (so their
codec decodes fall on different steps), step until every one has delivered its first audio,
then time the pure decode steps of ``calibration.duration_ms`` of audio in windows of one
chunk period (each
window holds one codec decode per stream) and record the median of the window means, which
shrugs off a burst of noise from a neighbour on a shared machine. Every point is measured
twice, once on the way up and once on the way down, keeping the *slower*: a CPU's steps move
from one run to the next (clock boost, where the pages land, a 2-core Xeon's sweeps a third
apart from start to start), and a claim cached at the fast end of that scatter is one a wave
of its size does not hold. The spread of the window means (their 90th percentile over the
median, pooled over all points) is the calibration's *jitter*, what admission allows for
before live steps are seen.
The sweep stops once a point is more than twice the real-time step budget (larger batches
cannot be admitted anyway). One more point decodes a smaller batch at a long context
(``calibration.long_context_tokens`` prompt tokens) so attention's share is measured too
(twice as well, keeping the slower).
Single prompts of three lengths, each prefilled alone in one step, give what a prompt row
costs: for its layers and for each position its attention reads (a long prompt's rows cost
more; where they do not fit one step, the long prompts' prefill steps give one flat cost per
row). The best point's frames
per second over the frame rate is the engine's saturated throughput in streams.
Last, with the fitted model guiding the deadline policy, waves of simultaneous arrivals
(:mod:`cadenza.engine.realtime.arrival_waves`) measure how many streams can start at once
and keep every chunk on time through their first chunks and the chunks after them.

The result is cached as JSON under ``calibration.cache_dir`` keyed by everything that
changes step time: model, weights and KV dtypes, seed, device name, threads, torch and cadenza
versions, and the engine settings involved. ``calibration.mode = "refresh"`` measures again;
``"off"`` skips it. A calibration read from the cache is followed by a warm-up
(:func:`warm_up`): the engine runs the calibration's smallest point and its largest real-time
one once, unmeasured, so the first streams served do not pay the one-off costs (kernel
selection, allocations, first touches of the cache) that a sweep pays for itself.
"""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np
import torch

from cadenza.contract.calibration import Calibration, StepRepeat
from cadenza.contract.engine_stats import StepRecord
from cadenza.contract.request import FinishReason, StreamOutput, SynthesisRequest
from cadenza.contract.step_time_model import (
    StepSample,
    StepTimeModel,
    nonnegative_least_squares,
    step_budget_s,
)
from cadenza.engine.device import device_name
from cadenza.engine.engine import Engine
from cadenza.engine.realtime.arrival_waves import measure_waves
from cadenza.engine.realtime.calibration_cache import (
    cache_path,
    calibration_identity,
    read_cache,
    write_cache,
)
from cadenza.engine.realtime.calibration_checks import (
    calibration_problems,
    conservative,
    cores_taken,
)
from cadenza.engine.realtime.synthetic_streams import (
    SHORT_PROMPT_CHARS,
    steps_to_measure,
    synthetic_request,
    synthetic_streams_fit,
)

log = logging.getLogger(__name__)

# Prompts whose prefill gives a prompt row's cost (:func:`_measure_prefill`): a short, a
# typical and a long utterance, each prefilled in one step.
_PREFILL_PROMPT_CHARS = (48, 192, 448)


def load_or_calibrate(
    engine: Engine,
    seed: int = 0,
    neighbours: int = 0,
    progress: Callable[[str], None] | None = None,
) -> Calibration | None:
    """The configured calibration of ``engine`` (read from the cache or measured now);
    ``None`` when calibration is off or the model produces no audio. The caller applies it
    (:meth:`Engine.apply_calibration`). ``neighbours``: how many other engine replicas share
    this machine and calibrate at the same time (their steps slow this one's: shared caches,
    memory bandwidth, a host's sibling threads), part of the cache key. ``progress`` is told
    each stage as it begins (each sweep, the warm-up), for the edge's start deadline."""
    mode = engine.config.calibration.mode
    if mode == "off" or engine.policy is None:
        return None
    stage = progress or (lambda _: None)
    identity = calibration_identity(engine, seed, neighbours)
    path = cache_path(engine, identity)
    calibration: Calibration | None = None
    if mode == "auto" and path.is_file():
        calibration = read_cache(path, engine.config.calibration.tolerance)
    if calibration is None:
        calibration = _measure_consistent(engine, identity, stage)
        if calibration.consistent:
            write_cache(path, calibration)
    else:
        stage("warming up")
        warm_up(engine, calibration)
    log.info(
        "step time (%s, %s, beside %d other replica(s)): %s; %.3f ms per 1k context; %.4f ms "
        "per prompt row and %.3f us per position it reads; codec %.3f ms per frame; jitter "
        "x%.2f; saturated throughput %.1f streams; repeats within %.0f%%, at least %.0f%% "
        "of its cores' time",
        calibration.source,
        calibration.device_name,
        neighbours,
        ", ".join(f"{t} streams {ms:.2f} ms" for t, _, ms in calibration.model.decode_points),
        calibration.model.per_kilocontext_ms,
        calibration.model.prefill_ms_per_token,
        1000.0 * calibration.model.prefill_ms_per_row_position,
        calibration.codec_ms_per_frame,
        calibration.jitter,
        calibration.throughput_streams,
        100.0 * max((r.spread for r in calibration.repeats), default=0.0),
        100.0 * min((r.cpu_share for r in calibration.repeats), default=1.0),
    )
    return calibration


def _measure_consistent(
    engine: Engine, identity: str, stage: Callable[[str], None] = lambda _: None
) -> Calibration:
    """Sweeps until one agrees with itself (``calibration.attempts`` at most); if none
    does, :func:`conservative` of them all, which is served but never cached. A sweep
    measured while something else ran on the engine's cores (:func:`cores_taken`) is not
    followed by another: that one would most likely meet the same neighbour (two nodes
    calibrating side by side on one machine each see the other) and only delay the start;
    the engine serves on the conservative calibration and measures again once it is idle
    on a quiet machine (``calibration.remeasure_idle_s``, :mod:`.remeasure`). ``stage`` is
    told as each sweep begins."""
    attempts: list[Calibration] = []
    config = engine.config.calibration
    limit = config.attempts
    for number in range(1, limit + 1):
        stage(f"calibrating (attempt {number} of {limit})")
        attempt = run_sweep(engine, identity)
        attempts.append(attempt)
        if attempt.consistent:
            return replace(attempt, attempts=number)
        log.warning(
            "calibration attempt %d of %d contradicts itself (was the machine busy?): %s",
            number,
            limit,
            "; ".join(attempt.problems),
        )
        if number < limit and cores_taken(attempt, config.tolerance):
            log.warning(
                "something else ran on the engine's cores while it measured: no further "
                "attempt now (it would measure the same neighbour)"
            )
            break
    combined = conservative(attempts)
    remeasure = (
        f"it measures again once idle for {config.remeasure_idle_s:g} s"
        if config.remeasure_idle_s > 0
        else 'restart on a quiet machine (or with calibration.mode = "refresh") to measure again'
    )
    log.warning(
        "no calibration agreed with itself in %d attempt(s): serving with a conservative one "
        "(each point at its fastest, jitter x%.2f), not cached; %s",
        len(attempts),
        combined.jitter,
        remeasure,
    )
    return combined


def warm_up(engine: Engine, calibration: Calibration) -> list[int]:
    """Run ``engine`` (which must be idle) through the synthetic streams of two of
    ``calibration``'s points, unmeasured: its smallest batch and the largest whose calibrated
    step fits the real-time budget (the batches live steps run at). A fresh process pays
    one-off costs on its first steps of each kind (cadenza-tiny, a wave of 16 new streams:
    its first 30 steps ran 1.79x the model cold and 1.54x after this warm-up, medians of
    five pairs, ``benchmarks/cold_start_ab.py``); a sweep pays them on its own first pass,
    a cached calibration would leave them to the first streams served. Returns the batch
    sizes run; the engine is idle again afterwards and reports none of these steps."""
    if engine.has_unfinished_requests():
        raise RuntimeError("the warm-up needs an idle engine")
    info = engine.info
    budget_ms = 1000.0 * step_budget_s(
        info.frame_period_s, info.shape.steps_per_frame, engine.config.realtime.headroom
    )
    points = calibration.model.decode_points
    if not points:
        return []
    real_time = [tokens for tokens, _, ms in points if ms <= budget_ms]
    batches = sorted({points[0][0], max(real_time, default=points[0][0])})
    batches = [
        b
        for b in batches
        if b <= engine.scheduler.max_num_seqs
        and synthetic_streams_fit(engine, b, SHORT_PROMPT_CHARS)
    ]
    started = time.perf_counter()
    for batch in batches:
        _measure(engine, batch, SHORT_PROMPT_CHARS)
    log.info(
        "warmed up at %s streams in %.1f s",
        ", ".join(str(b) for b in batches),
        time.perf_counter() - started,
    )
    return batches


def run_sweep(engine: Engine, identity: str = "") -> Calibration:
    """Measure step times on ``engine`` (which must be idle) and fit a model. The engine is
    idle again afterwards; its prefix cache may hold the synthetic prompts."""
    if engine.has_unfinished_requests():
        raise RuntimeError("calibration needs an idle engine")
    config, info = engine.config, engine.info
    started = time.perf_counter()
    budget_ms = 1000.0 * step_budget_s(
        info.frame_period_s, info.shape.steps_per_frame, config.realtime.headroom
    )
    samples: list[StepSample] = []
    spreads: list[float] = []  # window means over their point's median
    codec_ms = 0.0
    largest = 0
    # A first pass pays one-off costs (kernel selection, allocations) that live steps never
    # see again: measured, they would inflate the smallest batch's point (and, the points
    # being monotone, the next ones too).
    smallest = min(config.calibration.batch_sizes)
    if smallest <= engine.scheduler.max_num_seqs and synthetic_streams_fit(
        engine, smallest, SHORT_PROMPT_CHARS
    ):
        _measure(engine, smallest, SHORT_PROMPT_CHARS)
    points: dict[int, _Point] = {}
    for batch in sorted(set(config.calibration.batch_sizes)):
        if batch > engine.scheduler.max_num_seqs or not synthetic_streams_fit(
            engine, batch, SHORT_PROMPT_CHARS
        ):
            break
        points[batch] = _measure(engine, batch, SHORT_PROMPT_CHARS)
        if points[batch].sample.ms > 2 * budget_ms and len(points) >= 2:
            break
    # Each batch is measured once more, in the opposite order (so a slow spell does not hit
    # the same points twice), and keeps the slower of its two measurements: the claim is
    # priced at the slow end of what this machine's steps do from one moment to the next.
    repeats: list[StepRepeat] = []
    for batch in sorted(points, reverse=True):
        again = _measure(engine, batch, SHORT_PROMPT_CHARS)
        first = points[batch]
        share = min(first.cpu_share, again.cpu_share)
        repeats.append(
            StepRepeat(batch, first.sample.context_tokens, first.sample.ms, again.sample.ms, share)
        )
        if again.sample.ms > first.sample.ms:
            points[batch] = again
    for batch, point in sorted(points.items()):
        samples.append(point.sample)
        spreads += [m / point.sample.ms for m in point.window_means]
        largest, codec_ms = batch, point.codec_ms_per_frame
    long_sample = None
    prefill_ms_per_token = 0.0
    if config.calibration.long_context_tokens > 0 and samples:
        batch = max(1, min(8, largest))
        if synthetic_streams_fit(engine, batch, config.calibration.long_context_tokens):
            # Measured twice as well, keeping the slower: this one point sets what every
            # position a step reads costs, and so the claim at long contexts.
            point = _measure(engine, batch, config.calibration.long_context_tokens)
            again = _measure(engine, batch, config.calibration.long_context_tokens)
            share = min(point.cpu_share, again.cpu_share)
            repeats.append(
                StepRepeat(
                    batch, point.sample.context_tokens, point.sample.ms, again.sample.ms, share
                )
            )
            if again.sample.ms > point.sample.ms:
                point = again
            long_sample, prefill_ms_per_token = point.sample, point.prefill_ms_per_token
    prefill_ms_per_row_position = 0.0
    prefill_fit = _measure_prefill(engine)
    if prefill_fit is not None:
        prefill_ms_per_token, prefill_ms_per_row_position = prefill_fit
    model = StepTimeModel.fit(
        samples, long_sample, prefill_ms_per_token, prefill_ms_per_row_position
    )
    frames_per_step = 1.0 / info.shape.steps_per_frame
    throughput = max(
        s.tokens * frames_per_step * info.frame_period_s * 1000.0 / s.ms for s in samples
    )
    long_throughput = 0.0
    if long_sample is not None:
        samples.append(long_sample)
        long_throughput = (
            long_sample.tokens * frames_per_step * info.frame_period_s * 1000.0 / long_sample.ms
        )
    calibration = Calibration(
        model=model,
        samples=tuple(samples),
        codec_ms_per_frame=codec_ms,
        device_name=device_name(engine.model.device),
        identity=identity,
        measured_s=time.perf_counter() - started,
        jitter=max(_percentile(spreads, 0.9), 1.0) if spreads else 1.0,
        throughput_streams=round(throughput, 2),
        long_context_throughput_streams=round(long_throughput, 2),
        repeats=tuple(repeats),
    )
    waves = measure_waves(engine, calibration, budget_ms)
    calibration = replace(calibration, waves=tuple(waves), measured_s=time.perf_counter() - started)
    problems = calibration_problems(calibration, config.calibration.tolerance)
    return replace(calibration, problems=tuple(problems))


@dataclass(frozen=True)
class _Point:
    sample: StepSample
    window_means: list[float]  # ms, one per chunk-period window
    codec_ms_per_frame: float
    prefill_ms_per_token: float  # median over the point's pure prefill steps (0: none)
    cpu_share: float  # this process's CPU time over wall time x its threads, while timed


def _percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(int(share * len(ordered)), len(ordered) - 1)]


def _prefill_steps(engine: Engine, request: SynthesisRequest, steps: int) -> list[StepRecord]:
    """The steps that only prefilled, of ``steps`` run with ``request`` alone (then dropped)."""
    try:
        engine.add_request(request)
        for _ in range(steps):
            engine.step()
        return [step for step in engine.take_report().steps if step.decodes == 0]
    finally:
        engine.abort_request(request.request_id)
        engine.step()
        engine.take_report()


def _measure_prefill_in_chunks(engine: Engine, slowest: dict[tuple[int, int], float]) -> None:
    """Where prompts of every length have the same rows (Bark pads its text to a fixed
    prompt), one prompt prefilled in chunks of an eighth, a quarter and a half of it: each
    chunk after its prompt's first (which also opens the stream) a point of ``slowest`` (rows,
    positions before them), three times, keeping the median (chunks this small cost little
    more than a step's fixed part, and the slowest of them is mostly noise)."""
    scheduler = engine.scheduler
    budget = scheduler.max_num_batched_tokens
    request = synthetic_request(engine, SHORT_PROMPT_CHARS, "calibration")
    rows = min(engine.info.shape.max_prompt_tokens(request.text), budget)
    times: dict[tuple[int, int], list[float]] = {}
    try:
        for chunk in (max(rows // 8, 1), max(rows // 4, 1), max(rows // 2, 1)) * 3:
            scheduler.max_num_batched_tokens = chunk
            request = synthetic_request(engine, SHORT_PROMPT_CHARS, "calibration")
            steps = _prefill_steps(engine, request, -(-rows // chunk))  # a chunk a step
            before = steps[0].tokens if steps else 0  # the rows prefilled so far
            for step in steps[1:]:
                times.setdefault((step.tokens, before), []).append(1000.0 * step.seconds)
                before += step.tokens
    finally:
        scheduler.max_num_batched_tokens = budget
    slowest.update({key: statistics.median(ms) for key, ms in times.items()})


def _measure_prefill(engine: Engine) -> tuple[float, float] | None:
    """What a prompt row costs, from single prompts of ``_PREFILL_PROMPT_CHARS`` prefilled
    alone in one step each (twice, keeping the slower; where every text gives the same rows,
    one prompt in chunks instead): ``ms = fixed + per_row * rows + per_position * positions
    read``, fitted by non-negative least squares; returns ``(per_row, per_position)``, or
    ``None`` where fewer than three lengths fit one step."""
    slowest: dict[tuple[int, int], float] = {}  # (rows, positions before them) -> ms
    fitted_lengths: set[int] = set()  # the prompt lengths measured in one step
    for chars in _PREFILL_PROMPT_CHARS * 2:
        if chars > engine.config.limits.max_input_chars or not synthetic_streams_fit(
            engine, 1, chars
        ):
            continue
        request = synthetic_request(engine, chars, "calibration")
        rows_at_most = engine.info.shape.max_prompt_tokens(request.text)
        if rows_at_most > engine.config.engine.max_num_batched_tokens:
            continue  # more than one step's rows
        steps = _prefill_steps(engine, request, 1)
        # The whole prompt in one step (its context: every row); a shared prefix may come
        # from the prefix cache, and the step's rows then start after it.
        if len(steps) == 1 and 0 < steps[0].tokens <= steps[0].context_tokens:
            step = steps[0]
            key = (step.tokens, step.context_tokens - step.tokens)
            ms = 1000.0 * step.seconds
            slowest[key] = max(ms, slowest.get(key, ms))
            fitted_lengths.add(chars)
    if len(fitted_lengths) >= 2 and len({rows for rows, _ in slowest}) == 1:
        slowest.clear()  # texts of every length gave the same rows: chunks of one instead
        _measure_prefill_in_chunks(engine, slowest)
    if len({rows for rows, _ in slowest}) < 3:
        return None
    keys = sorted(slowest)
    rows = np.array([r for r, _ in keys], dtype=float)
    before = np.array([b for _, b in keys], dtype=float)
    columns = [np.ones_like(rows), rows, rows * (before + (rows + 1) / 2.0)]
    target = np.array([slowest[key] for key in keys])
    _, per_row, per_position = nonnegative_least_squares(columns, target)
    if per_row == 0.0 and per_position == 0.0:
        return None
    return per_row, per_position


def _measure(engine: Engine, batch: int, prompt_chars: int) -> _Point:
    """Mean time of pure decode steps with ``batch`` streams; codec ms per stream-frame; and
    what a prompt row cost in the pure prefill steps on the way. A stream that ends on its
    own (a model's end of speech) is replaced by a new one, so the batch holds."""
    requests = [synthetic_request(engine, prompt_chars, "calibration") for _ in range(batch)]
    window = engine.frames.chunk_frames * engine.info.shape.steps_per_frame
    heard: set[str] = set()

    def step() -> list[StreamOutput]:
        outputs = engine.step()
        live = {request.request_id for request in requests}
        for output in outputs:
            if (
                output.finished
                and output.request_id in live
                and output.finish_reason
                in (
                    FinishReason.EOS,
                    FinishReason.LENGTH,
                )
            ):
                replacement = synthetic_request(engine, prompt_chars, "calibration")
                requests.append(replacement)
                engine.add_request(replacement)
        return outputs

    try:
        # Arrivals spread over one chunk period, as live streams arrive: their codec decodes
        # then fall on different steps, as they do in service.
        for group in (requests[i::window] for i in range(min(window, batch))):
            for request in group:
                engine.add_request(request)
            heard.update(o.request_id for o in step() if o.audio.size)
        for _ in range(steps_to_measure(engine) * 4):
            if len(heard) >= batch:
                break
            heard.update(o.request_id for o in step() if o.audio.size)
        prefill_rates = [
            1000.0 * s.seconds / s.tokens
            for s in engine.take_report().steps  # measure decode steps from here
            if s.decodes == 0 and s.tokens >= 64
        ]
        window_means, contexts = [], []
        codec_s, codec_frames = 0.0, 0
        cpu_started, wall_started = time.process_time(), time.perf_counter()
        for _ in range(max(engine.frames.calibration_steps // window, 1)):
            for _ in range(window):
                step()
            report = engine.take_report()
            codec_s, codec_frames = codec_s + report.codec_s, codec_frames + report.codec_frames
            pure = [s for s in report.steps if s.decodes == batch and s.tokens == batch]
            if pure:
                window_means.append(1000.0 * sum(s.seconds for s in pure) / len(pure))
                contexts += [s.context_tokens for s in pure]
        wall_s = (time.perf_counter() - wall_started) * torch.get_num_threads()
        cpu_share = (time.process_time() - cpu_started) / wall_s if wall_s > 0 else 1.0
        if not window_means:
            raise RuntimeError(f"calibration at batch {batch} produced no pure decode steps")
        sample = StepSample(
            tokens=batch,
            context_tokens=round(sum(contexts) / len(contexts)),
            ms=statistics.median(window_means),
        )
        log.debug("calibration point: %s", sample)
        return _Point(
            sample,
            window_means,
            1000.0 * codec_s / codec_frames if codec_frames else 0.0,
            statistics.median(prefill_rates) if prefill_rates else 0.0,
            min(cpu_share, 1.0),
        )
    finally:
        for request in requests:
            engine.abort_request(request.request_id)
        engine.step()  # delivers (and drops) the cancellations
        engine.take_report()
