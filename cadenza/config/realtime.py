"""``[realtime]``: the audio's pace, what each stream is due when, and how far ahead it may run
(``engine/realtime/``, ``engine/chunk_policy.py``). Durations are in milliseconds; an engine
counts them in its codec's frames (``chunk_policy.config_in_codec_frames``)."""

from __future__ import annotations

from pydantic import Field

from cadenza.config.section import Section


class RealtimeConfig(Section):
    """Chunk sizes, real-time targets and the lead a stream may take on its listener."""

    first_chunk_ms: float = Field(
        107.0,
        gt=0,
        le=10000,
        description="audio in a stream's first chunk (small: fast TTFA), as the nearest whole "
        "number of the codec's frames (at least one: EnCodec 8, Mimi and SNAC 1), plus the "
        "frames the codec looks ahead (SNAC: 3)",
    )
    chunk_ms: float = Field(
        200.0,
        gt=0,
        le=10000,
        description="audio per later chunk sent to the edge, as the nearest whole number of "
        "the codec's frames (at least one: EnCodec 15, Mimi and SNAC 2)",
    )
    ttfa_target_ms: float = Field(
        300.0, gt=0, description="a stream's first chunk is due this long after it arrives"
    )
    playout_reserve_ms: float = Field(
        100.0,
        ge=0,
        description="audio a listener buffers before playing; later chunks are due against it",
    )
    prompt_ttfa_multiple: float = Field(
        12.0,
        ge=0,
        description="a prompt longer than the nominal (64-character) one has its first chunk "
        "due later than ttfa_target_ms by this many times what its extra rows take to prefill "
        "alone (so this many long prompts arriving together all start on time, and shorter "
        "prompts, due sooner, are prefilled first); 0: every first chunk is due at the target",
    )
    max_lead_ms: float = Field(
        1500.0,
        gt=0,
        description="how far ahead of its listener a stream is generated: when every stream "
        "is further ahead, the engine waits and leaves the CPU to the edge",
    )
    lead_hysteresis_ms: float = Field(
        300.0,
        ge=0,
        description="once every stream is max_lead_ms ahead, the engine rests until the "
        "least ahead is this much below it, then steps back to back (warm steps in bursts "
        "instead of one cold step per frame)",
    )
    headroom: float = Field(
        0.1,
        ge=0,
        lt=1,
        description="share of each frame period kept free: steps and admission aim below it",
    )
