"""OpenAI-compatible speech API: ``POST /v1/audio/speech`` and ``GET /v1/models``.

The body is read with a size cap and a stall timeout, decoded under the edge's JSON policy and
checked against the schema, then the stream goes through the admission lease like every other
transport's. Every field of OpenAI's speech request is accepted (a voice object ``{"id": name}``
names the voice ``name``); the ones no served model uses (``instructions``) are checked, then
named in the response's ``X-Cadenza-Ignored-Fields``. Fields that are neither OpenAI's nor
cadenza's own extensions are refused. The response starts only after the engine's first chunk,
so a refusal is still a JSON error; after that the audio streams as chunked transfer, chunk by
chunk as the engine produces it. A client that disconnects, or stops reading for
``server.send_timeout_s``, has its stream cancelled. ``speed`` changes the tempo (not the pitch)
as the audio streams; ``stream_format: "sse"`` wraps the same bytes in OpenAI's
``speech.audio.delta`` / ``speech.audio.done`` events.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import uuid
from collections.abc import AsyncGenerator, Awaitable
from typing import Annotated, Literal, TypeVar

from fastapi import APIRouter, Request
from pydantic import BeforeValidator, ConfigDict, Field
from pydantic_core import PydanticCustomError

from cadenza.contract.request import StreamOutput, SynthesisRequest
from cadenza.edge.auth.principal import Principal
from cadenza.edge.media.containers import StreamEncoder, open_encoder
from cadenza.edge.media.tempo import TempoChanger
from cadenza.edge.server.state import EdgeState
from cadenza.edge.streams.errors import EdgeError
from cadenza.edge.streams.lease import StreamLease
from cadenza.edge.streams.sampling_fields import SamplingFields
from cadenza.edge.streams.text_stream import audio_only, sentence_by_sentence
from cadenza.edge.streams.untrusted_json import dump_json
from cadenza.edge.transports.http_io import StreamedBody, read_body
from cadenza.edge.transports.json_body import parse_json_body

MAX_BODY_BYTES = 64 * 1024
DISCONNECT_POLL_S = 0.5
MAX_INSTRUCTIONS_CHARS = 4096  # OpenAI's own cap
# OpenAI's fields that are accepted and checked but that no served model uses: a request that
# sets one is served as if it had not, and the response says so in this header.
IGNORED_OPENAI_FIELDS = ("instructions",)
IGNORED_FIELDS_HEADER = "X-Cadenza-Ignored-Fields"

router = APIRouter()

T = TypeVar("T")


def _voice_name(value: object) -> object:
    """OpenAI's custom-voice object ``{"id": name}`` stands for the voice ``name``; any other
    object is refused here, and every other value is left to the string check."""
    if not isinstance(value, dict):
        return value
    if value.keys() == {"id"} and isinstance(value["id"], str):
        return value["id"]
    raise PydanticCustomError("voice_object", 'a voice object must be {"id": "<voice name>"}')


class SpeechRequest(SamplingFields):
    """OpenAI's speech request, plus the extensions ``max_duration_s``, the sampling settings
    (``seed``, ``temperature``, ``top_k``, ``top_p``, ``min_p``, ``repetition_penalty``,
    ``fine_temperature``; unset ones take the model's defaults) and ``priority``: the admission
    class (``realtime``, ``standard``, ``batch``; see docs/capacity.md). Over capacity a
    request waits in its class's queue or gets 503 with ``Retry-After``.

    ``voice`` is always a voice name, whether the body gave a string or a voice object.
    ``instructions`` is accepted (a string of at most 4,096 characters) and not used: see
    :meth:`ignored_fields`."""

    model_config = ConfigDict(extra="forbid")

    model: str
    input: str
    voice: Annotated[str, BeforeValidator(_voice_name)] = "default"
    instructions: str | None = Field(None, max_length=MAX_INSTRUCTIONS_CHARS)
    response_format: Literal["mp3", "opus", "aac", "flac", "wav", "pcm"] = "mp3"
    speed: float = Field(1.0, ge=0.25, le=4.0, strict=True)  # not true nor "1.5"
    stream_format: Literal["audio", "sse"] = "audio"
    max_duration_s: float | None = None
    priority: Literal["realtime", "standard", "batch"] = "standard"

    def ignored_fields(self) -> list[str]:
        """The fields of :data:`IGNORED_OPENAI_FIELDS` this request sets (to anything but
        null or an empty string), in that order; empty when nothing was ignored."""
        return [name for name in IGNORED_OPENAI_FIELDS if getattr(self, name)]


def parse_speech_request(raw: bytes) -> SpeechRequest:
    """A speech request body. Raises :class:`EdgeError` 400 ``invalid_json``,
    ``unknown_field`` or ``invalid_value`` (:func:`parse_json_body`)."""
    return parse_json_body(raw, SpeechRequest)


@router.get("/v1/models")
async def list_models(request: Request) -> dict[str, object]:
    state: EdgeState = request.app.state.edge
    principal = _authenticate(state, request)
    # Every served model, whether or not its engines can take work right now (a model whose
    # engines are restarting is still this server's; streams to it get 503 meanwhile).
    infos = [
        s.identity
        for s in state.services.values()
        if principal.models is None or s.identity.model_name in principal.models
    ]
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
                "sampling_fields": list(info.sampling_fields),
            }
            for info in infos
        ],
    }


@router.post("/v1/audio/speech")
async def create_speech(request: Request) -> StreamedBody:
    state: EdgeState = request.app.state.edge
    server = state.config.server
    principal = _authenticate(state, request)
    raw = await read_body(
        request, max_bytes=MAX_BODY_BYTES, timeout_s=server.request_body_timeout_s
    )
    body = parse_speech_request(raw)
    service = state.service(body.model, transport="http")
    info = service.info()
    encoder = open_encoder(body.response_format, info.sample_rate)
    tempo = TempoChanger(info.sample_rate, body.speed) if body.speed != 1.0 else None
    request_id = uuid.uuid4().hex
    synthesis = SynthesisRequest(
        request_id=request_id,
        text=body.input,
        voice=body.voice,
        max_duration_s=body.max_duration_s,
        sampling=body.sampling(info.default_sampling),
    )
    text = sentence_by_sentence(state.config, synthesis, info)
    lease = await _unless_client_leaves(
        request,
        service.admission.open(
            transport="http",
            principal=principal,
            request=synthesis,
            priority=body.priority,
            text_stream=text is not None,
        ),
    )
    outputs = lease.outputs() if text is None else audio_only(text.play(lease, principal))

    async def end_stream() -> None:
        try:
            await outputs.aclose()  # aborts the engine request if it did not finish
        finally:
            lease.close()

    try:
        first = await anext(outputs)
    except BaseException:
        await end_stream()
        raise
    audio = _encode(outputs, first, encoder, tempo)
    headers = {"X-Request-Id": request_id}
    if ignored := body.ignored_fields():
        headers[IGNORED_FIELDS_HEADER] = ", ".join(ignored)
    return StreamedBody(
        _as_sse(audio) if body.stream_format == "sse" else audio,
        media_type="text/event-stream" if body.stream_format == "sse" else encoder.media_type,
        headers=headers,
        send_timeout_s=server.send_timeout_s,
        on_close=end_stream,
    )


async def _unless_client_leaves(request: Request, admission: Awaitable[StreamLease]) -> StreamLease:
    """Wait for the lease, giving up (and leaving the queue) if the client hangs up meanwhile:
    nothing is sent before the slot, so only polling notices a departure."""
    task = asyncio.ensure_future(admission)
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=DISCONNECT_POLL_S)
            if done:
                return task.result()
            if await request.is_disconnected():
                raise EdgeError(499, "the client closed the request", code="client_closed")
    except BaseException:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, EdgeError):
            (await task).close()  # admitted just as the client left
        raise


async def _encode(
    outputs: AsyncGenerator[StreamOutput, None],
    first: StreamOutput,
    encoder: StreamEncoder,
    tempo: TempoChanger | None,
) -> AsyncGenerator[bytes, None]:
    """The response body: every output encoded as it arrives, then the encoder's tail. The
    stream behind it is ended by the response's ``on_close``."""
    output = first
    while True:
        samples = output.audio if tempo is None else tempo.process(output.audio)
        data = encoder.encode(samples)
        if data:
            yield data
        if output.finished:
            break
        output = await anext(outputs)
    tail = encoder.encode(tempo.flush()) if tempo is not None else b""
    tail += encoder.finish()
    if tail:
        yield tail


async def _as_sse(audio: AsyncGenerator[bytes, None]) -> AsyncGenerator[bytes, None]:
    """OpenAI's SSE framing: ``speech.audio.delta`` events with base64 audio, then
    ``speech.audio.done``."""
    sent = 0
    try:
        async for data in audio:
            sent += len(data)
            event = {"type": "speech.audio.delta", "audio": base64.b64encode(data).decode()}
            yield f"data: {dump_json(event)}\n\n".encode()
    finally:
        await audio.aclose()
    done = {"type": "speech.audio.done", "usage": {"audio_bytes": sent}}
    yield f"data: {dump_json(done)}\n\n".encode()


def _authenticate(state: EdgeState, request: Request) -> Principal:
    return state.authenticate(
        request.headers.get("authorization"),
        request.client.host if request.client else None,
        request.headers.get("origin"),
    )
