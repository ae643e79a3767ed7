"""Turning a protocol ``speak`` (WebSocket or WebRTC data channel) into an engine request."""

from __future__ import annotations

import uuid

from cadenza.admission.validation import InvalidRequest, validate_synthesis
from cadenza.config import LimitsConfig
from cadenza.engine.messages import EngineInfo
from cadenza.engine.request import SynthesisRequest
from cadenza.engine.sampling_params import SamplingParams
from cadenza.stream.protocol import ProtocolError, Speak


def synthesis_request(speak: Speak, info: EngineInfo, limits: LimitsConfig) -> SynthesisRequest:
    """Validate ``speak`` against the served model and the limits; raises
    :class:`ProtocolError` with the validation's error code."""
    try:
        validate_synthesis(
            model=info.model_name,
            text=speak.text,
            voice=speak.voice,
            max_duration_s=speak.max_duration_s,
            served_model=info.model_name,
            voices=info.voices,
            limits=limits,
        )
    except InvalidRequest as exc:
        raise ProtocolError(exc.code, exc.message) from exc
    return SynthesisRequest(
        request_id=uuid.uuid4().hex,
        text=speak.text,
        voice=speak.voice,
        max_duration_s=speak.max_duration_s,
        sampling=SamplingParams(seed=speak.seed),
    )
