"""``[limits]``: what any one request may ask for, whatever the transport."""

from __future__ import annotations

from pydantic import Field

from cadenza.config.section import Section


class LimitsConfig(Section):
    """Validation limits applied to every request, whatever the transport."""

    max_input_chars: int = Field(4096, ge=1, description="longest text accepted")
    max_duration_s: float = Field(300.0, gt=0, description="longest audio one request may ask for")
    chars_per_second: float = Field(
        14.0, gt=0, description="speaking rate used to derive a request's duration from its text"
    )
    min_duration_s: float = Field(1.0, gt=0, description="shortest derived duration")
    requests_per_minute: float = Field(
        0, ge=0, description="requests one client (API key, or IP when open) may start; 0: any"
    )
    audio_seconds_per_minute: float = Field(
        0, ge=0, description="seconds of audio one client may request per minute; 0: any"
    )
    max_prompt_audio_s: float = Field(
        20.0, gt=0, description="longest speech prompt (microphone audio) a request may carry"
    )
    max_context_s: float = Field(
        120.0,
        gt=0,
        description="conversation sessions keep their most recent turns up to this many "
        "seconds of audio as the next turn's context (older turns are dropped)",
    )
