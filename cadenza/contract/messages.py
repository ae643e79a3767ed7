"""The wire between the edge's engine client and the engine loop: one frozen dataclass per
message kind, one encoder (:func:`encode`) and one decoder (:func:`decode`) for all of them.

Each message travels as one msgpack map; its ``type`` key names the kind::

    edge -> engine   add       AddRequest(request)          start a stream
                     abort     AbortRequest(request_id)     stop it (no-op if it ended)
                     probe     Probe(batch, max_ms)         measure idle steps (if idle)
                     shutdown  Shutdown()                   finish the loop
    engine -> edge   starting  Starting(stage, cpu_s)       every second while it loads and
                                                            calibrates: what it does, how much
                                                            CPU time it has used (its progress)
                     ready     Ready(info)                  once, after loading and calibrating
                     output    Output(...)                  a stream's next audio; its last one
                                                            says why it finished
                     stats     Stats(stats, report)         every 0.5 s; also the heartbeat
                     probed    Probed(report, batch, ...)   a probe's steps, once it ran
                     recalibrated  Recalibrated(calibration)  a conservative calibration
                                                            measured again and replaced
                     fatal     Fatal(message)               the engine cannot go on

Decoding validates every field (types, shapes, enums) against these dataclasses, so a garbled
message raises :class:`WireError` instead of reaching a handler half-read.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Literal

import msgpack
import numpy as np
from pydantic import Field, TypeAdapter, ValidationError

from cadenza.contract.calibration import Calibration
from cadenza.contract.engine_info import EngineInfo
from cadenza.contract.engine_stats import EngineStats, ProbeOutcome, StepReport
from cadenza.contract.request import FinishReason, StreamOutput, SynthesisRequest


class WireError(ValueError):
    """Bytes that are not a valid message. ``request_id``: the stream the message was about,
    when that much could be read (so its sender can be answered)."""

    def __init__(self, message: str, request_id: str | None = None) -> None:
        super().__init__(message)
        self.request_id = request_id


@dataclass(frozen=True)
class AddRequest:
    request: SynthesisRequest
    type: Literal["add"] = field(default="add", kw_only=True)


@dataclass(frozen=True)
class AbortRequest:
    request_id: str
    type: Literal["abort"] = field(default="abort", kw_only=True)


@dataclass(frozen=True)
class Probe:
    """Run ``batch`` synthetic streams for at most ``max_ms`` if the engine is idle, and say
    how fast they ran (:mod:`cadenza.engine.realtime.probe`)."""

    batch: Annotated[int, Field(ge=1, le=4096)]
    max_ms: Annotated[float, Field(gt=0, le=10_000)]
    type: Literal["probe"] = field(default="probe", kw_only=True)


@dataclass(frozen=True)
class Shutdown:
    type: Literal["shutdown"] = field(default="shutdown", kw_only=True)


@dataclass(frozen=True)
class Starting:
    """The engine is still starting: ``stage`` says what it does (loading, calibrating, which
    attempt), ``cpu_s`` how much CPU time its process has used so far. The edge waits for an
    engine whose CPU time grows, however long its calibration takes on a busy machine, and
    gives up on one that stops making progress (``supervision.startup_timeout_s``)."""

    stage: Annotated[str, Field(max_length=200)]
    cpu_s: Annotated[float, Field(ge=0)]
    type: Literal["starting"] = field(default="starting", kw_only=True)


@dataclass(frozen=True)
class Ready:
    info: EngineInfo
    type: Literal["ready"] = field(default="ready", kw_only=True)


@dataclass(frozen=True)
class Output:
    """A :class:`StreamOutput` on the wire: ``audio`` float32 little-endian samples, ``codes``
    uint16 little-endian ``[frames, num_codebooks]``, ``rows`` int32 little-endian
    ``[rows, row_width]`` (``None``: none). ``sent_s``: the engine's ``time.monotonic()`` as it
    sent the message (one clock for every process of a machine), which the edge compares with
    its own on receipt; ``None``: not stamped."""

    request_id: str
    audio: bytes
    codes: bytes | None = None
    num_codebooks: int = 0
    finish_reason: FinishReason | None = None
    error: str | None = None
    error_code: str | None = None
    rows: bytes | None = None
    row_width: int = 0
    sent_s: float | None = None
    type: Literal["output"] = field(default="output", kw_only=True)

    @classmethod
    def of(cls, output: StreamOutput, sent_s: float | None = None) -> Output:
        codes, rows = output.codes, output.rows
        return cls(
            request_id=output.request_id,
            audio=np.ascontiguousarray(output.audio, dtype="<f4").tobytes(),
            codes=None if codes is None else np.ascontiguousarray(codes, dtype="<u2").tobytes(),
            num_codebooks=0 if codes is None else int(codes.shape[1]),
            finish_reason=output.finish_reason,
            error=output.error,
            error_code=output.error_code,
            rows=None if rows is None else np.ascontiguousarray(rows, dtype="<i4").tobytes(),
            row_width=0 if rows is None else int(rows.shape[1]),
            sent_s=sent_s,
        )

    def stream_output(self) -> StreamOutput:
        """Raises :class:`WireError` when the byte counts do not fit their dtypes."""
        torn_codes = self.codes is not None and (
            self.num_codebooks < 1 or len(self.codes) % (2 * self.num_codebooks)
        )
        torn_rows = self.rows is not None and (
            self.row_width < 1 or len(self.rows) % (4 * self.row_width)
        )
        if len(self.audio) % 4 or torn_codes or torn_rows:
            raise WireError(f"output for {self.request_id!r} has torn audio, codes or rows")
        return StreamOutput(
            request_id=self.request_id,
            audio=np.frombuffer(self.audio, dtype="<f4"),
            finish_reason=self.finish_reason,
            error=self.error,
            codes=None
            if self.codes is None
            else np.frombuffer(self.codes, dtype="<u2").reshape(-1, self.num_codebooks),
            error_code=self.error_code,
            rows=None
            if self.rows is None
            else np.frombuffer(self.rows, dtype="<i4").reshape(-1, self.row_width),
        )


@dataclass(frozen=True)
class Stats:
    stats: EngineStats
    report: StepReport
    type: Literal["stats"] = field(default="stats", kw_only=True)


@dataclass(frozen=True)
class Probed:
    """What a probe ran (:class:`ProbeResult`): its steps, its batch (0: nothing ran) and
    how it ended."""

    report: StepReport
    batch: int
    outcome: ProbeOutcome
    type: Literal["probed"] = field(default="probed", kw_only=True)


@dataclass(frozen=True)
class Recalibrated:
    """The engine, which served with a conservative calibration (its start-up sweeps
    contradicted themselves: the machine was busy), measured its steps again while idle and
    got one that agrees with itself; it serves with this one from now on, and admission
    should price it with it (the rest of its ``ready`` info stands)."""

    calibration: Calibration
    type: Literal["recalibrated"] = field(default="recalibrated", kw_only=True)


@dataclass(frozen=True)
class Fatal:
    message: str
    type: Literal["fatal"] = field(default="fatal", kw_only=True)


EdgeMessage = AddRequest | AbortRequest | Probe | Shutdown
"""What the edge sends to the engine."""

EngineMessage = Starting | Ready | Output | Stats | Probed | Recalibrated | Fatal
"""What the engine sends to the edge."""

Message = EdgeMessage | EngineMessage

_ADAPTER: TypeAdapter[Message] = TypeAdapter(
    Annotated[
        AddRequest
        | AbortRequest
        | Probe
        | Shutdown
        | Starting
        | Ready
        | Output
        | Stats
        | Probed
        | Recalibrated
        | Fatal,
        Field(discriminator="type"),
    ]
)


def encode(message: Message) -> bytes:
    return msgpack.packb(_ADAPTER.dump_python(message), use_bin_type=True)


def decode(data: bytes) -> Message:
    """Raises :class:`WireError` for anything that is not one valid message."""
    try:
        raw = msgpack.unpackb(data, raw=False)
    except (ValueError, msgpack.UnpackException, TypeError) as exc:
        raise WireError(f"not a msgpack message: {exc}") from exc
    try:
        return _ADAPTER.validate_python(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        raise WireError(
            f"invalid engine message at {where}: {first['msg']}", _request_id_of(raw)
        ) from exc


def _request_id_of(raw: object) -> str | None:
    if not isinstance(raw, dict):
        return None
    request = raw.get("request")
    request_id = request.get("request_id") if isinstance(request, dict) else None
    if request_id is None:
        request_id = raw.get("request_id")  # abort, output
    return request_id if isinstance(request_id, str) else None
