"""The wire format between the edge's :class:`EngineClient` and the engine loop.

Each message is one msgpack map with a ``type`` key. No torch here.

edge -> engine
    ``add``       {request: {request_id, text, voice, max_duration_s, sampling: {...}}}
    ``abort``     {request_id}
    ``shutdown``  {}
engine -> edge
    ``ready``     {info: EngineInfo fields}                        once, after loading
    ``output``    {request_id, audio: float32 LE bytes, codes: uint16 LE bytes [frames, K] or
                  None, num_codebooks, finish_reason, error, error_code}
    ``stats``     {step_s: [seconds of each step since the last stats], step_decodes: [decode
                  tokens in each of those steps], chunk_slack_ms: [slack of each chunk
                  delivered], engine: EngineStats fields}
    ``fatal``     {message}                                        the engine cannot go on
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import msgpack
import numpy as np

from cadenza.engine.request import FinishReason, StreamOutput, SynthesisRequest
from cadenza.engine.sampling_params import SamplingParams

if TYPE_CHECKING:
    from cadenza.engine.engine import EngineStats


@dataclass(frozen=True)
class EngineInfo:
    """What the edge needs to know about the loaded model."""

    model_name: str
    voices: tuple[str, ...]
    sample_rate: int
    frame_rate: float
    device: str
    steps_per_frame: int = 1  # engine steps per codec frame (1 for parallel layouts)
    block_size: int = 16  # tokens per KV page
    kv_blocks_total: int = 0
    max_num_seqs: int = 0
    calibration: dict[str, Any] | None = field(default=None, hash=False)  # Calibration.to_dict


def pack(message: dict[str, Any]) -> bytes:
    return msgpack.packb(message, use_bin_type=True)


def unpack(data: bytes) -> dict[str, Any]:
    message = msgpack.unpackb(data, raw=False)
    if not isinstance(message, dict) or "type" not in message:
        raise ValueError("engine message must be a map with a 'type'")
    return message


def add_message(request: SynthesisRequest) -> dict[str, Any]:
    return {"type": "add", "request": asdict(request)}


def request_from_message(message: dict[str, Any]) -> SynthesisRequest:
    fields = dict(message["request"])
    fields["sampling"] = SamplingParams(**fields["sampling"])
    return SynthesisRequest(**fields)


def output_message(output: StreamOutput, error_code: str | None = None) -> dict[str, Any]:
    return {
        "type": "output",
        "request_id": output.request_id,
        "audio": np.ascontiguousarray(output.audio, dtype="<f4").tobytes(),
        "codes": None if output.codes is None else output.codes.astype("<u2").tobytes(),
        "num_codebooks": 0 if output.codes is None else output.codes.shape[1],
        "finish_reason": output.finish_reason.value if output.finish_reason else None,
        "error": output.error,
        "error_code": error_code,
    }


def output_from_message(message: dict[str, Any]) -> StreamOutput:
    reason = message["finish_reason"]
    return StreamOutput(
        request_id=message["request_id"],
        audio=np.frombuffer(message["audio"], dtype="<f4"),
        finish_reason=FinishReason(reason) if reason else None,
        error=message["error"],
        codes=None
        if message.get("codes") is None
        else np.frombuffer(message["codes"], dtype="<u2").reshape(-1, message["num_codebooks"]),
    )


def info_message(info: EngineInfo) -> dict[str, Any]:
    return {"type": "ready", "info": asdict(info)}


def info_from_message(message: dict[str, Any]) -> EngineInfo:
    fields = dict(message["info"])
    fields["voices"] = tuple(fields["voices"])
    return EngineInfo(**fields)


@dataclass
class StepLog:
    """What the engine loop records per step between two ``stats`` messages."""

    step_s: list[float] = field(default_factory=list)
    step_decodes: list[int] = field(default_factory=list)


def stats_message(log: StepLog, chunk_slack_s: list[float], stats: EngineStats) -> dict[str, Any]:
    return {
        "type": "stats",
        "step_s": log.step_s,
        "step_decodes": log.step_decodes,
        "chunk_slack_ms": [round(1000.0 * s, 2) for s in chunk_slack_s],
        "engine": asdict(stats),
    }
