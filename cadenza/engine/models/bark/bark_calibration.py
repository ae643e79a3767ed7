"""Bark's start-up calibration: what one codec frame of every stream's audio costs, per batch.

A Bark stream's work is not one token per frame: about two thirds of a semantic token, two
coarse tokens, a share of the coarse windows' prompts and of the fine windows, and EnCodec. So
the engine's "step" is one frame of audio for every running stream, and it is measured whole:
``B`` nominal streams (greedy, Bark's longest utterance, 15.4 s, or the calibration's duration
when longer; the first voice preset) run together from their first semantic prompt to their
last sample, and the wall time over the frames each made is the step, or more where the
deadlines demand it: a stream's audio comes a fine window at a time, and the work after its
first chunk must keep ahead of its listener (:func:`deadline_load`, as a share of a frame
period), which a long utterance, whose later chunks are short, needs more than the average.
Every batch step it ran, with the work in it, fits
:class:`~cadenza.engine.models.bark.bark_step_cost.BarkStepCost`, what the engine weighs its
live steps by. The stages' shares come from the batch's own clocks
(:attr:`~cadenza.engine.models.bark.bark_batch.BarkBatch.seconds`). Batches grow through
``calibration.batch_sizes`` until a step no longer fits one frame period. The first audio of
the first (single-stream) run, a whole fine window of the longest utterance (the latest any
stream's first audio comes alone), is the TTFA the engine announces.

The result is a :class:`~cadenza.contract.calibration.Calibration` whose decode points are
these steps at no context, so admission's real-time limit reads it as it reads any engine's. A
prompt's cost is inside the steps measured (the prompts ran in them), so the model's prompt
rows are priced at :data:`PROMPT_FOLDED_MS`. It is measured at every start (no cache)."""

from __future__ import annotations

import itertools
import time

from cadenza.contract.calibration import Calibration, StageTime
from cadenza.contract.request import SynthesisRequest
from cadenza.contract.sampling import SamplingParams
from cadenza.contract.step_time_model import StepSample, StepTimeModel, step_budget_s
from cadenza.engine.device import device_name, resolve_device
from cadenza.engine.models.bark.bark_engine import BarkEngine
from cadenza.engine.models.bark.bark_step_cost import BarkStepCost, StepWork
from cadenza.engine.models.registry import checkpoint_identity

CALIBRATION_TEXT = (
    "The quick brown fox jumps over the lazy dog, and then it rests for a while. When the sun"
    " goes down it walks back home along the river, past the mill and the old stone bridge."
)

PROMPT_FOLDED_MS = 1e-6
"""What admission's step-time model charges a prompt row: nothing to speak of, because every
prompt's cost is already inside the measured per-frame steps."""


def calibrate_bark(engine: BarkEngine) -> tuple[Calibration, BarkStepCost]:
    """Measure ``engine`` as the module's docstring says, and fit what each of its steps cost
    by the work in it; it is idle before and after."""
    config = engine.config
    frame_ms = 1000.0 / engine.frame_rate
    budget_ms = 1000.0 * step_budget_s(frame_ms / 1000.0, 1, config.realtime.headroom)
    constants = engine.bark.constants
    longest_s = constants.max_new_semantic_tokens / constants.semantic_rate_hz
    duration_s = max(config.calibration.duration_ms / 1000.0, longest_s)
    reserve_s = config.realtime.playout_reserve_ms / 1000.0
    voice = engine.voices[1] if len(engine.voices) > 1 else engine.voices[0]
    started = time.perf_counter()
    samples: list[StepSample] = []
    stages: list[StageTime] = []
    first_audio_s = 0.0
    steps: list[tuple[StepWork, float]] = []
    sizes = sorted({b for b in config.calibration.batch_sizes if b <= engine.max_streams} or {1})
    engine.rests = False  # every step of the sweep runs all of its streams
    for streams in sizes:
        before = dict(engine.batch.seconds)
        run_started = time.perf_counter()
        first: float | None = None
        samples_made = 0
        chunks: dict[str, list[tuple[float, float]]] = {}
        for index in range(streams):
            engine.add_request(
                SynthesisRequest(
                    f"calibration-{streams}-{index}",
                    CALIBRATION_TEXT,
                    voice,
                    max_duration_s=duration_s,
                    sampling=SamplingParams(temperature=0.0, top_k=0, seed=index),
                )
            )
        while engine.has_unfinished_requests():
            for output in engine.step():
                samples_made += output.audio.size
                if output.audio.size:
                    now = time.perf_counter() - run_started
                    first = now if first is None else first
                    seconds = output.audio.size / engine.sample_rate
                    chunks.setdefault(output.request_id, []).append((now, seconds))
            work, seconds = engine.last_step
            steps.append((work, 1000.0 * seconds))
        elapsed_ms = 1000.0 * (time.perf_counter() - run_started)
        hop = engine.sample_rate / engine.frame_rate
        frames = max(samples_made / hop / streams, 1.0)  # each stream's, on average
        ms_per_frame = max(elapsed_ms / frames, frame_ms * deadline_load(chunks, reserve_s))
        samples.append(StepSample(streams, 0, ms_per_frame))
        for stage, seconds in engine.batch.seconds.items():
            spent_ms = 1000.0 * (seconds - before.get(stage, 0.0))
            stages.append(StageTime(stage, streams, spent_ms / frames))
        if streams == sizes[0]:
            first_audio_s = first or elapsed_ms / 1000.0
        if ms_per_frame > budget_ms:
            break
    best = max(samples, key=lambda s: s.tokens * frame_ms / s.ms)
    codec = [s for s in stages if s.stage == "codec"]
    engine.rests = True
    engine.take_report()  # the calibration's own steps are not live evidence
    calibration = Calibration(
        model=StepTimeModel.fit(samples, prefill_ms_per_token=PROMPT_FOLDED_MS),
        samples=tuple(samples),
        codec_ms_per_frame=codec[-1].ms_per_frame / max(codec[-1].streams, 1) if codec else 0.0,
        device_name=device_name(resolve_device(engine.device)),
        identity=checkpoint_identity(config.model.name),
        measured_s=time.perf_counter() - started,
        throughput_streams=best.tokens * frame_ms / best.ms,
        stages=tuple(stages),
        first_audio_s=first_audio_s,
    )
    return calibration, BarkStepCost.fit(steps)


def deadline_load(chunks: dict[str, list[tuple[float, float]]], reserve_s: float) -> float:
    """How much of real time the streams' work after their first audio needed: each stream's
    chunks (``(delivered at, seconds of audio)``, in order) are due as its listener, who starts
    at the first one after ``reserve_s``, reaches them; the most any chunk took since the first
    over the time it had (above 1: late). 0 for streams of one chunk."""
    load = 0.0
    for delivered in chunks.values():
        start, heard = delivered[0][0], 0.0
        for (_, seconds), (at, _) in itertools.pairwise(delivered):
            heard += seconds
            load = max(load, (at - start) / (reserve_s + heard))
    return load
