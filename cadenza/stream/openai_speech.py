"""OpenAI-compatible speech API: ``POST /v1/audio/speech`` and ``GET /v1/models``.

The body is read with a size cap, parsed, checked against the schema (unknown fields are
refused) and the validation limits, then submitted to the engine. The response starts only
after the engine's first chunk, so a request the engine refuses still gets a JSON error; after
that the audio streams as chunked transfer, chunk by chunk as the engine produces it. A client
that disconnects cancels its stream in the engine. ``speed`` changes the tempo (not the pitch)
of the audio as it streams; ``stream_format: "sse"`` wraps the same bytes in OpenAI's
``speech.audio.delta`` / ``speech.audio.done`` events.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import math
import time
import uuid
from collections.abc import AsyncGenerator
from typing import Literal

from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from cadenza.admission.gate import AdmissionRefused, Ticket
from cadenza.admission.priority_queues import Priority
from cadenza.admission.rate_limit import Grant, RateLimited
from cadenza.admission.validation import InvalidRequest, validate_synthesis
from cadenza.codecs.containers import (
    StreamEncoder,
    UnsupportedFormat,
    open_encoder,
)
from cadenza.codecs.tempo import TempoChanger
from cadenza.engine.engine_client import EngineError
from cadenza.engine.request import StreamOutput, SynthesisRequest
from cadenza.engine.sampling_params import SamplingParams
from cadenza.stream.errors import ApiError
from cadenza.stream.state import EdgeState

MAX_BODY_BYTES = 64 * 1024

log = logging.getLogger(__name__)

router = APIRouter()


class SpeechRequest(BaseModel):
    """OpenAI's speech request, plus the extensions ``seed``, ``max_duration_s`` and
    ``priority``: the admission class (``realtime``, ``standard``, ``batch``; see
    docs/capacity.md). Over capacity a request waits in its class's queue or gets 503 with
    ``Retry-After``."""

    model_config = ConfigDict(extra="forbid")

    model: str
    input: str
    voice: str = "default"
    response_format: Literal["mp3", "opus", "aac", "flac", "wav", "pcm"] = "mp3"
    speed: float = Field(1.0, ge=0.25, le=4.0)
    stream_format: Literal["audio", "sse"] = "audio"
    seed: int | None = Field(None, ge=0, lt=2**63)
    max_duration_s: float | None = None
    priority: Literal["realtime", "standard", "batch"] = "standard"


@router.get("/v1/models")
async def list_models(request: Request) -> dict[str, object]:
    state: EdgeState = request.app.state.edge
    state.authenticate(request.headers.get("authorization"), _peer(request))
    info = state.engine_info()
    return {
        "object": "list",
        "data": [
            {
                "id": info.model_name,
                "object": "model",
                "created": state.started_at,
                "owned_by": "cadenza",
                "voices": list(info.voices),
                "sample_rate": info.sample_rate,
            }
        ],
    }


@router.post("/v1/audio/speech")
async def create_speech(request: Request) -> StreamingResponse:
    state: EdgeState = request.app.state.edge
    client = state.authenticate(request.headers.get("authorization"), _peer(request))
    body = await _parse_body(request)
    info = state.engine_info()
    try:
        validate_synthesis(
            model=body.model,
            text=body.input,
            voice=body.voice,
            max_duration_s=body.max_duration_s,
            served_model=info.model_name,
            voices=info.voices,
            limits=state.config.limits,
        )
    except InvalidRequest as exc:
        raise ApiError.from_invalid(exc) from exc
    try:
        encoder = open_encoder(body.response_format, info.sample_rate)
    except UnsupportedFormat as exc:
        raise ApiError(400, str(exc), code="unsupported_format", param="response_format") from exc

    refusal = await state.screen(body.input, client)
    if refusal is not None:
        raise ApiError(400, refusal, code="content_refused", param="input")
    try:
        grant = state.admit(client, body.input, body.max_duration_s)
    except RateLimited as exc:
        raise ApiError(
            429,
            str(exc),
            code="rate_limited",
            headers={"Retry-After": str(math.ceil(exc.retry_after_s))},
        ) from exc
    request_id = uuid.uuid4().hex
    synthesis = SynthesisRequest(
        request_id=request_id,
        text=body.input,
        voice=body.voice,
        max_duration_s=body.max_duration_s,
        sampling=SamplingParams(seed=body.seed),
    )
    tempo = TempoChanger(info.sample_rate, body.speed) if body.speed != 1.0 else None
    try:
        ticket = await _while_connected(request, state, synthesis, body.priority)
    except AdmissionRefused as exc:
        state.settle(grant, 0.0)
        raise ApiError.from_refusal(exc) from exc
    except BaseException:
        state.settle(grant, 0.0)
        raise
    started = time.perf_counter()
    outputs = state.engine.generate(synthesis)
    try:
        first = await _first_output(outputs)
    except BaseException:
        state.settle(grant, 0.0)
        state.release_slot(ticket)
        raise
    state.metrics.time_to_first_audio.observe(time.perf_counter() - started)
    audio = _stream_audio(
        state, outputs, first, encoder, tempo, info.sample_rate, request_id, grant, ticket
    )
    headers = {"X-Request-Id": request_id}
    if body.stream_format == "sse":
        return StreamingResponse(_as_sse(audio), media_type="text/event-stream", headers=headers)
    return StreamingResponse(audio, media_type=encoder.media_type, headers=headers)


DISCONNECT_POLL_S = 0.5


async def _while_connected(
    request: Request, state: EdgeState, synthesis: SynthesisRequest, priority: Priority
) -> Ticket:
    """Wait for an admission slot, giving up (and leaving the queue) if the client hangs up
    meanwhile: nothing is sent before the slot, so only polling notices a departure."""
    task = asyncio.ensure_future(state.acquire_slot(synthesis, priority))
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=DISCONNECT_POLL_S)
            if done:
                return task.result()
            if await request.is_disconnected():
                raise ApiError(499, "the client closed the request", code="client_closed")
    except BaseException:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, AdmissionRefused):
            ticket = await task
            state.release_slot(ticket)  # admitted just as the client left
        raise


async def _as_sse(audio: AsyncGenerator[bytes, None]) -> AsyncGenerator[bytes, None]:
    """OpenAI's SSE framing: ``speech.audio.delta`` events with base64 audio, then
    ``speech.audio.done``."""
    sent = 0
    try:
        async for data in audio:
            sent += len(data)
            event = {"type": "speech.audio.delta", "audio": base64.b64encode(data).decode()}
            yield f"data: {json.dumps(event)}\n\n".encode()
    finally:
        await audio.aclose()
    done = {"type": "speech.audio.done", "usage": {"audio_bytes": sent}}
    yield f"data: {json.dumps(done)}\n\n".encode()


def _peer(request: Request) -> str | None:
    return request.client.host if request.client else None


async def _parse_body(request: Request) -> SpeechRequest:
    raw = bytearray()
    async for piece in request.stream():
        raw += piece
        if len(raw) > MAX_BODY_BYTES:
            raise ApiError(
                413, f"request body exceeds {MAX_BODY_BYTES} bytes", code="body_too_large"
            )
    try:
        payload = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ApiError(400, f"request body is not valid JSON: {exc}", code="invalid_json") from exc
    if not isinstance(payload, dict):
        raise ApiError(400, "request body must be a JSON object", code="invalid_json")
    try:
        return SpeechRequest.model_validate(payload)
    except ValidationError as exc:
        first = exc.errors()[0]
        param = ".".join(str(p) for p in first["loc"]) or None
        message = f"{param}: {first['msg']}" if param else first["msg"]
        code = "unknown_field" if first["type"] == "extra_forbidden" else "invalid_value"
        raise ApiError(400, message, code=code, param=param) from exc


async def _first_output(outputs: AsyncGenerator[StreamOutput, None]) -> StreamOutput:
    """The stream's first output; engine errors become API errors (nothing was sent yet)."""
    try:
        return await anext(outputs)
    except EngineError as exc:
        status = {"rejected": 400, "unavailable": 503}.get(exc.code, 500)
        raise ApiError(status, str(exc), code=f"engine_{exc.code}") from exc
    except BaseException:
        await outputs.aclose()  # cancelled while waiting: abort the engine request
        raise


async def _stream_audio(
    state: EdgeState,
    outputs: AsyncGenerator[StreamOutput, None],
    first: StreamOutput,
    encoder: StreamEncoder,
    tempo: TempoChanger | None,
    sample_rate: int,
    request_id: str,
    grant: Grant,
    ticket: Ticket,
) -> AsyncGenerator[bytes, None]:
    state.metrics.streams_active.inc()
    reason = "cancelled"
    produced_s = 0.0
    try:
        output = first
        while True:
            produced_s += len(output.audio) / sample_rate
            state.metrics.audio_seconds.inc(len(output.audio) / sample_rate)
            samples = output.audio if tempo is None else tempo.process(output.audio)
            data = encoder.encode(samples)
            if data:
                yield data
            if output.finish_reason is not None:
                reason = output.finish_reason.value
                break
            output = await anext(outputs)
        tail = encoder.encode(tempo.flush()) if tempo is not None else b""
        tail += encoder.finish()
        if tail:
            yield tail
    except EngineError as exc:
        reason = "error"
        log.warning("stream %s failed after its headers were sent: %s", request_id, exc)
        # The status line is gone: ending the body without its final chunk is the only way
        # left to tell the client the audio is incomplete.
        raise
    finally:
        state.settle(grant, produced_s)
        state.release_slot(ticket)
        state.metrics.streams_active.dec()
        state.metrics.streams_finished.labels(reason=reason).inc()
        await outputs.aclose()  # aborts the engine request if it did not finish
