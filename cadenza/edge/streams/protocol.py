"""The WebSocket protocol, version 1, without I/O: parse what clients send, build what the
server sends. The speak session (:mod:`cadenza.edge.streams.speak_session`, behind WebSocket and the
WebRTC control channel) and the SDK (``cadenza.client``) both use it; docs/protocol.md
describes every message and error code.

Text messages are JSON objects with a ``type``. Audio travels in binary messages::

    offset  size  field
    0       4     magic b"CZA1"
    4       4     stream id (uint32 LE): which ``speak`` this audio belongs to
    8       4     chunk index (uint32 LE), from 0 per stream
    12      ...   payload: pcm -> s16le samples; opus -> one 20 ms Opus packet;
                  encodec -> frames x codebooks uint16 LE codes, frame-major
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from cadenza.edge.streams.resume_token import TOKEN_PATTERN
from cadenza.edge.streams.sampling_fields import SamplingFields
from cadenza.edge.streams.untrusted_json import JsonRejected, dump_json, parse_json

PROTOCOL_VERSION = 1
AUDIO_MAGIC = b"CZA1"
AUDIO_HEADER = struct.Struct("<4sII")
FORMATS = ("pcm", "opus", "encodec")
PCM_SAMPLE_RATES = (16000, 24000, 48000)


class ProtocolError(ValueError):
    """A client message the server refuses; ``code`` is the documented error code."""

    def __init__(self, code: str, message: str, stream_id: int | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.stream_id = stream_id


class _Message(BaseModel):
    # Strict: a field of the wrong JSON type (``true`` or ``"48000"`` for a sample rate, ``1.5``
    # for a seed) is refused as invalid_message, not coerced.
    model_config = ConfigDict(extra="forbid", strict=True)


class Speak(_Message, SamplingFields):
    type: Literal["speak"]
    text: str | None = None  # required, except with text_stream (then the first piece)
    model: str | None = None  # a served model's name; None: the server's default
    voice: str = "default"
    format: Literal["pcm", "opus", "encodec"] = "pcm"
    sample_rate: int | None = None
    max_duration_s: float | None = None
    priority: Literal["realtime", "standard", "batch"] = "realtime"
    use_audio_prompt: bool = False
    # Conversation mode (models that take context, such as Sesame CSM): the session's earlier
    # turns come before the text; with use_audio_prompt the microphone audio is the user's
    # turn, spoken as ``user_voice`` (a speaker id of the model), transcribed as ``user_text``.
    conversation: bool = False
    user_voice: str | None = None
    user_text: str = ""
    # The text arrives while the stream plays: ``text`` messages append to it, ``flush``
    # speaks what has arrived, ``text_end`` ends it (:mod:`cadenza.edge.streams.text_stream`).
    text_stream: bool = False

    @property
    def first_text(self) -> str:
        return self.text or ""


class AudioIn(_Message):
    """Announces microphone audio: the binary messages that follow carry it."""

    type: Literal["audio_in"]
    format: Literal["pcm", "opus"] = "pcm"
    sample_rate: Literal[16000, 24000, 48000] = 16000


class Hello(_Message):
    """Authentication for clients that cannot set an Authorization header (browsers)."""

    type: Literal["hello"]
    api_key: str


class Resume(_Message):
    """Go on with a stream whose connection (or node) was lost before its ``done``: the
    ``resume_token`` from its ``started``, and how much of its audio the client has, in
    samples at the stream's sample rate (``pcm``, ``opus``) or in codec frames (``encodec``)."""

    type: Literal["resume"]
    token: Annotated[str, Field(pattern=TOKEN_PATTERN)]
    samples_heard: Annotated[int, Field(ge=0, le=2**40)] | None = None
    frames_heard: Annotated[int, Field(ge=0, le=2**32)] | None = None


class Text(_Message):
    """More text for the text stream ``stream_id``."""

    type: Literal["text"]
    stream_id: Annotated[int, Field(ge=0, le=2**32 - 1)]
    text: str


class Flush(_Message):
    """Speak the text stream's text that has arrived, without waiting for a boundary."""

    type: Literal["flush"]
    stream_id: Annotated[int, Field(ge=0, le=2**32 - 1)]


class TextEnd(_Message):
    """No more text comes for the text stream: ``done`` follows its last audio."""

    type: Literal["text_end"]
    stream_id: Annotated[int, Field(ge=0, le=2**32 - 1)]


class Cancel(_Message):
    type: Literal["cancel"]


class Ping(_Message):
    type: Literal["ping"]
    data: Any = None


class Close(_Message):
    type: Literal["close"]


class ResetConversation(_Message):
    """Forget the session's conversation turns."""

    type: Literal["reset_conversation"]


AnyClientMessage = (
    Speak | AudioIn | Hello | Resume | Text | Flush | TextEnd | Cancel | Ping | Close
    | ResetConversation
)  # fmt: skip
ClientMessage = Annotated[AnyClientMessage, Field(discriminator="type")]
_CLIENT_MESSAGE: TypeAdapter[ClientMessage] = TypeAdapter(ClientMessage)
CLIENT_TYPES = (
    "speak", "audio_in", "hello", "resume", "text", "flush", "text_end", "cancel", "ping",
    "close", "reset_conversation",
)  # fmt: skip
FEATURES = ("text_stream", "spill")  # what ``ready`` lists: protocol 1 additions it speaks

# A client's header on the upgrade: ``1`` asks a node that cannot start one more stream at
# once to refuse the upgrade (503 ``at_capacity``) so that a front door places the session on
# another node; ``0`` (or no header) accepts it as before (docs/protocol.md).
SPILL_HEADER = "X-Cadenza-Spill"


def wants_spill(value: str | None) -> bool:
    """The :data:`SPILL_HEADER` of an upgrade (``None``: absent). Raises
    :class:`ProtocolError` ``invalid_header`` for anything but ``1`` or ``0``."""
    if value is None or value == "0":
        return False
    if value == "1":
        return True
    shown = value[:32].encode("ascii", "backslashreplace").decode("ascii")
    raise ProtocolError("invalid_header", f"{SPILL_HEADER} must be 1 or 0, got {shown!r}")


def parse_client_message(text: str) -> AnyClientMessage:
    """One text message from a client. Raises :class:`ProtocolError` with ``invalid_json``,
    ``unknown_type`` or ``invalid_message``."""
    try:
        payload = parse_json(text)
    except JsonRejected as exc:
        raise ProtocolError("invalid_json", f"message: {exc}") from exc
    if not isinstance(payload, dict):
        raise ProtocolError("invalid_json", "message must be a JSON object")
    kind = payload.get("type")
    if kind not in CLIENT_TYPES:
        raise ProtocolError(
            "unknown_type", f"unknown message type {kind!r}; expected one of {CLIENT_TYPES}"
        )
    try:
        message = _CLIENT_MESSAGE.validate_python(payload)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"][1:]) or "message"
        raise ProtocolError("invalid_message", f"{where}: {first['msg']}") from exc
    if isinstance(message, Speak) and message.text is None and not message.text_stream:
        raise ProtocolError("invalid_message", "text: Field required (unless text_stream)")
    return message


def resolve_sample_rate(speak: Speak, native_rate: int, codes_as_ids: bool = True) -> int:
    """The rate the stream's audio will have: pcm at one of :data:`PCM_SAMPLE_RATES` or, when
    asked, the model's own (``native_rate``; unasked, the model's own where it is one of
    them, else the highest). ``codes_as_ids``: whether the model's codec frames are ids the
    ``encodec`` format can send. Raises :class:`ProtocolError`."""
    if speak.format == "encodec" and not codes_as_ids:
        raise ProtocolError(
            "invalid_format",
            "this model's codec frames are continuous latents, not codes: ask for pcm or opus",
        )
    if speak.format == "opus":
        if speak.sample_rate not in (None, 48000):
            raise ProtocolError("invalid_sample_rate", "opus audio is always 48000 Hz")
        return 48000
    if speak.format == "encodec":
        if speak.sample_rate not in (None, native_rate):
            raise ProtocolError("invalid_sample_rate", f"encodec codes are at {native_rate} Hz")
        return native_rate
    rate = speak.sample_rate
    if rate is None:
        rate = native_rate if native_rate in PCM_SAMPLE_RATES else max(PCM_SAMPLE_RATES)
    if rate not in PCM_SAMPLE_RATES and rate != native_rate:
        raise ProtocolError(
            "invalid_sample_rate",
            f"pcm sample_rate must be one of {PCM_SAMPLE_RATES} or the model's own {native_rate}",
        )
    return rate


def server_message(kind: str, **fields: Any) -> str:
    """A server text message (``ready``, ``started``, ``done``, ``error``, ``pong``, ...), as
    standard JSON."""
    return dump_json({"type": kind, **fields})


def error_message(
    code: str,
    message: str,
    stream_id: int | None = None,
    retry_after_s: float | None = None,
) -> str:
    """An ``error``; ``retry_after_s`` when the refusal will pass (capacity, rate limits)."""
    fields: dict[str, Any] = {"code": code, "message": message, "stream_id": stream_id}
    if retry_after_s is not None:
        fields["retry_after_s"] = round(retry_after_s, 1)
    return server_message("error", **fields)


def queued_message(stream_id: int, position: int, estimated_wait_s: float) -> str:
    return server_message(
        "queued",
        stream_id=stream_id,
        position=position,
        estimated_wait_s=round(estimated_wait_s, 1),
    )


@dataclass(frozen=True)
class AudioFrame:
    stream_id: int
    index: int
    payload: bytes


def encode_audio_frame(stream_id: int, index: int, payload: bytes) -> bytes:
    return AUDIO_HEADER.pack(AUDIO_MAGIC, stream_id, index) + payload


def decode_audio_frame(data: bytes) -> AudioFrame:
    """A binary server message. Raises :class:`ProtocolError` (``invalid_audio_frame``)."""
    if len(data) < AUDIO_HEADER.size:
        raise ProtocolError("invalid_audio_frame", "binary message shorter than its header")
    magic, stream_id, index = AUDIO_HEADER.unpack_from(data)
    if magic != AUDIO_MAGIC:
        raise ProtocolError("invalid_audio_frame", f"bad magic {magic!r}")
    return AudioFrame(stream_id, index, data[AUDIO_HEADER.size :])
