"""Turning a protocol ``speak`` (WebSocket or WebRTC data channel) into an engine request."""

from __future__ import annotations

import uuid

from cadenza.admission.validation import InvalidRequest, validate_synthesis
from cadenza.config import LimitsConfig
from cadenza.engine.messages import EngineInfo
from cadenza.engine.request import SynthesisRequest
from cadenza.engine.sampling_params import SamplingParams
from cadenza.stream.microphone import MicrophoneBuffer
from cadenza.stream.protocol import ProtocolError, Speak


def synthesis_request(
    speak: Speak,
    info: EngineInfo,
    limits: LimitsConfig,
    microphone: MicrophoneBuffer | None = None,
) -> SynthesisRequest:
    """Validate ``speak`` against the served model and the limits; raises
    :class:`ProtocolError` with the validation's error code. With ``use_audio_prompt`` the
    microphone audio collected so far becomes the speech prompt (and is consumed)."""
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
    prompt_audio, prompt_rate = None, 24000
    if speak.use_audio_prompt:
        if microphone is None:
            raise ProtocolError("no_prompt_audio", "no microphone audio has been received")
        prompt_audio, prompt_rate = microphone.take(), microphone.sample_rate
    return SynthesisRequest(
        request_id=uuid.uuid4().hex,
        text=speak.text,
        voice=speak.voice,
        max_duration_s=speak.max_duration_s,
        sampling=SamplingParams(seed=speak.seed),
        prompt_audio=prompt_audio,
        prompt_sample_rate=prompt_rate,
    )
