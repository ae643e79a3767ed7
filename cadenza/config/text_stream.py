"""``[text_stream]``: streams whose text arrives while they play (``speak`` with
``text_stream``; :mod:`cadenza.edge.streams.text_segmenter` and
:mod:`cadenza.edge.streams.text_stream`)."""

from __future__ import annotations

from pydantic import Field

from cadenza.config.section import Section


class TextStreamConfig(Section):
    """How arriving text is cut into segments, and what one text stream may ask for."""

    segment_max_chars: int = Field(
        160,
        ge=20,
        le=4096,
        description="length limit: a segment that reaches it without a sentence end is cut at "
        "its last space",
    )
    clause_min_chars: int = Field(
        80,
        ge=1,
        description="a clause boundary (, ; : and dashes) ends a segment once it is this long; "
        "a sentence end always does",
    )
    segment_wait_ms: float = Field(
        600.0,
        gt=0,
        le=60_000,
        description="wait limit: text without a boundary that has waited this long while the "
        "stream has nothing to say is spoken up to its last space",
    )
    context_segments: int = Field(
        2,
        ge=0,
        le=8,
        description="models that take context (Sesame CSM) hear this many of the stream's "
        "earlier segments before each segment",
    )
    max_chars: int = Field(20_000, ge=1, description="text one stream may receive in all")
    max_segments: int = Field(
        200, ge=1, description="segments one stream may speak; text beyond them is refused"
    )
    idle_timeout_s: float = Field(
        30.0,
        gt=0,
        description="a stream that has said everything and waits this long for more text "
        "without text_end ends with reason text_timeout",
    )
