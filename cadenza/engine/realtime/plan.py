"""The :class:`RealtimePlan` an engine announces: its configured targets with the chunk sizes
as it actually cuts them (its codec's frames, the look-ahead in the first chunk) and the decode
steps its layout takes to produce the first chunk."""

from __future__ import annotations

from cadenza.config import RealtimeConfig
from cadenza.contract.realtime_plan import RealtimePlan
from cadenza.engine.chunk_policy import CodecFrames
from cadenza.engine.layouts.token_layout import TokenLayout, layout_steps_for_frames


def realtime_plan(
    realtime: RealtimeConfig,
    frames: CodecFrames,
    layout: TokenLayout,
    frame_rate: float,
    lookahead_frames: int,
    nominal_prompt_rows: int,
) -> RealtimePlan:
    """The plan of an engine with the ``realtime`` targets whose chunk sizes are ``frames``, in
    its codec's own frames (the first with the codec's ``lookahead_frames`` already added:
    :func:`~cadenza.engine.chunk_policy.config_in_codec_frames`), for a model whose ``layout``
    makes ``frame_rate`` frames a second (0: a text model, whose plan is all zeros)."""
    if frame_rate <= 0:
        return RealtimePlan(0.0, 0.0, 0.0, 0.0, 0, 0, 0, 0, 0.0, 0)
    return RealtimePlan(
        step_period_s=1.0 / frame_rate / layout.steps_per_frame,
        headroom=realtime.headroom,
        ttfa_target_s=realtime.ttfa_target_ms / 1000.0,
        playout_reserve_s=realtime.playout_reserve_ms / 1000.0,
        first_chunk_frames=frames.first_chunk_frames,
        first_chunk_steps=layout_steps_for_frames(layout, frames.first_chunk_frames),
        chunk_frames=frames.chunk_frames,
        lookahead_frames=lookahead_frames,
        max_lead_s=realtime.max_lead_ms / 1000.0,
        nominal_prompt_rows=nominal_prompt_rows,
        prompt_ttfa_multiple=realtime.prompt_ttfa_multiple,
    )
