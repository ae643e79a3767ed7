"""Synthetic streams the engine measures itself with: the start-up calibration's points and the
probes admission asks for while the engine is idle (:mod:`cadenza.engine.realtime.probe`).

Each is an ordinary speech request with a distinct random text (a prefix-cache hit would skip
the prefill being measured), long enough to run its first chunk and then
``engine.frames.calibration_steps`` decode steps and two more chunks.
"""

from __future__ import annotations

import secrets

from cadenza.contract.request import SynthesisRequest
from cadenza.contract.sampling import SamplingParams
from cadenza.contract.stream_length import frames_for_duration
from cadenza.engine.engine import Engine
from cadenza.engine.layouts.token_layout import layout_steps_for_frames

SHORT_PROMPT_CHARS = 32  # the prompts of the calibration's decode points and of probes
_WORDS = ("calibrate", "measure", "steady", "tempo", "voice", "step", "time", "frame")


def steps_to_measure(engine: Engine) -> int:
    """Decode steps one synthetic stream runs for: its first chunk, the calibration's steps
    and two more."""
    frames = engine.frames
    first_chunk = layout_steps_for_frames(engine.layout, frames.first_chunk_frames)
    return first_chunk + frames.calibration_steps + 2


def synthetic_request(engine: Engine, prompt_chars: int, purpose: str) -> SynthesisRequest:
    """A stream with a random ``prompt_chars``-character text (``purpose`` names it in its
    request id: ``calibration``, ``probe``)."""
    info = engine.info
    frames = steps_to_measure(engine) // info.shape.steps_per_frame + 2 * engine.frames.chunk_frames
    words = [secrets.choice(_WORDS) for _ in range(prompt_chars // 4 + 1)]
    text = " ".join(words)[:prompt_chars]
    return SynthesisRequest(
        request_id=f"{purpose}-{secrets.token_hex(6)}",
        text=text,
        voice=info.voices[0],
        max_duration_s=(frames + 8) / info.frame_rate,
        sampling=SamplingParams(seed=0),
    )


def synthetic_streams_fit(engine: Engine, batch: int, prompt_chars: int) -> bool:
    """Whether ``batch`` synthetic streams fit in the KV cache and the engine's limits (the
    streams it runs at once: fewer than ``engine.max_num_seqs`` where a model's per-stream
    state leaves room for fewer), with a text of ``prompt_chars`` the model takes (Bark reads
    at most 256 tokens at once)."""
    if batch > min(engine.config.engine.max_pending_requests, engine.scheduler.max_num_seqs):
        return False
    if prompt_chars > engine.config.limits.max_input_chars:
        return False
    request = synthetic_request(engine, prompt_chars, "fit")
    try:
        engine.model.check_request(request.text, request.sampling)
    except ValueError:
        return False
    info = engine.info
    assert request.max_duration_s is not None
    frames = frames_for_duration(request.max_duration_s, info.frame_rate)
    pages = info.shape.pages(info.shape.max_prompt_tokens(request.text), frames)
    return batch * pages <= info.kv_pages_total
