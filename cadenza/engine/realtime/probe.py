"""A probe: synthetic decode steps an idle engine runs when admission asks, so that a claim cut
by a slowdown can climb back without load to prove it (docs/capacity.md, "Recovery").

The engine starts ``batch`` synthetic streams (:mod:`synthetic_streams`: short random prompts,
the batch the claim would like to reach), steps them through their prompts and first chunks
and then a chunk period of pure decoding, and hands back every step it ran: admission weighs
them as it weighs live steps. The probe runs only on an engine with nothing else to do, stops
as soon as anything arrives for the engine (``interrupted``) or after ``max_ms`` (a machine still
slow shows that in fewer steps), and leaves the engine idle again, its synthetic streams
aborted and their pages free. Its outputs go nowhere.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from cadenza.contract.engine_stats import ProbeOutcome, ProbeResult, StepReport
from cadenza.engine.engine import Engine
from cadenza.engine.realtime.synthetic_streams import (
    SHORT_PROMPT_CHARS,
    synthetic_request,
    synthetic_streams_fit,
)
from cadenza.engine.serving_engine import ServingEngine


def probe_engine(
    engine: ServingEngine, batch: int, max_ms: float, interrupted: Callable[[], bool]
) -> ProbeResult:
    """Probe ``engine`` with up to ``batch`` synthetic streams (fewer where the KV pages or
    ``max_num_seqs`` hold fewer). The caller sends out what the engine reported before (it
    takes the report here, to keep the probe's steps apart). A batching
    :class:`~cadenza.engine.engine.Engine` with a calibrated step model is probed here; any
    other (the naive baseline) answers ``unsupported``."""
    if not isinstance(engine, Engine) or engine.policy is None or engine.policy.step_model is None:
        return ProbeResult(StepReport(), 0, "unsupported")
    if engine.has_unfinished_requests():
        return ProbeResult(StepReport(), 0, "busy")
    batch = min(max(batch, 1), engine.scheduler.max_num_seqs)
    while batch > 1 and not synthetic_streams_fit(engine, batch, SHORT_PROMPT_CHARS):
        batch -= 1
    requests = [synthetic_request(engine, SHORT_PROMPT_CHARS, "probe") for _ in range(batch)]
    plan = engine.realtime_plan
    steps_wanted = plan.first_chunk_steps + plan.chunk_frames * engine.info.shape.steps_per_frame
    deadline = time.perf_counter() + max_ms / 1000.0
    outcome: ProbeOutcome = "done"
    decode_steps = 0
    try:
        for request in requests:
            engine.add_request(request)
        while decode_steps < steps_wanted:
            if interrupted():
                outcome = "interrupted"
                break
            if time.perf_counter() >= deadline:
                outcome = "timed_out"
                break
            engine.step()
            last = engine.telemetry.last_step
            if last is not None and last.decodes > 0:
                decode_steps += 1
    finally:
        for request in requests:
            engine.abort_request(request.request_id)
        engine.step()  # delivers (and drops) the cancellations
    return ProbeResult(engine.take_report(), batch, outcome)
