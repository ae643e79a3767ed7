"""The engine as the edge sees it: the :class:`EngineInfo` announced in ``ready``.

Computed from the engine's parts when :mod:`cadenza.engine.builder` assembles it (before the
engine exists), so this module never needs the :class:`~cadenza.engine.engine.Engine` itself;
the engine adds what changes after the build (its calibration, the native kernels loaded).
"""

from __future__ import annotations

from cadenza.config.realtime import RealtimeConfig
from cadenza.contract.engine_info import EngineInfo
from cadenza.contract.kv_memory import StreamShape
from cadenza.contract.precision import Precision
from cadenza.contract.realtime_plan import RealtimePlan
from cadenza.engine.chunk_policy import CodecFrames
from cadenza.engine.layouts.token_layout import ContextRestarts
from cadenza.engine.models.model import AudioTokenModel
from cadenza.engine.realtime.plan import realtime_plan


def shape_of(model: AudioTokenModel, page_size: int) -> StreamShape:
    """How ``model``'s streams use KV memory in pages of ``page_size`` tokens (what admission
    costs a stream with)."""
    layout = model.layout
    restarts = layout if isinstance(layout, ContextRestarts) else None
    return StreamShape(
        page_size=page_size,
        steps_per_frame=layout.steps_per_frame,
        tail_steps=layout.tail_steps,
        prompt_overhead_tokens=prompt_overhead_tokens(model),
        max_context_tokens=None if restarts is None else restarts.max_context,
        context_rows_per_frame=0.0 if restarts is None else restarts.context_rows_per_frame,
    )


def prompt_overhead_tokens(model: AudioTokenModel) -> int:
    """Prompt tokens besides the text's, for the model's longest voice (0 for a text LM)."""
    if not model.layout.produces_audio:
        return 0
    return max(len(model.build_prompt("", voice)) for voice in model.voices)


def plan_of(
    model: AudioTokenModel,
    shape: StreamShape,
    realtime: RealtimeConfig,
    frames: CodecFrames,
    frame_rate: float,
    lookahead_frames: int,
) -> RealtimePlan:
    """The chunk plan and real-time targets of an engine serving ``model`` with a codec of
    ``frame_rate`` frames a second and ``lookahead_frames`` of look-ahead (all zeros for a
    text model, whatever the codec arguments say)."""
    audio = model.layout.produces_audio
    return realtime_plan(
        realtime,
        frames,
        model.layout,
        frame_rate if audio else 0.0,
        lookahead_frames if audio else 0,
        shape.nominal_prompt_tokens,
    )


def describe(
    model: AudioTokenModel,
    *,
    model_name: str,
    sample_rate: int,
    frame_rate: float,
    shape: StreamShape,
    plan: RealtimePlan,
    kv_pages_total: int,
    max_num_seqs: int,
    decodes_padded: bool,
    precision: Precision | None,
    codes_as_ids: bool = True,
) -> EngineInfo:
    """The announcement of an engine serving ``model`` (rates are 0 for a text model), before
    calibration and with no native kernels reported: the engine adds both when asked
    (:attr:`Engine.info <cadenza.engine.engine.Engine.info>`)."""
    audio = model.layout.produces_audio
    return EngineInfo(
        model_name=model_name,
        voices=model.voices,
        sample_rate=sample_rate if audio else 0,
        frame_rate=frame_rate if audio else 0.0,
        device=str(model.device),
        shape=shape,
        kv_pages_total=kv_pages_total,
        max_num_seqs=max_num_seqs,
        realtime=plan,
        calibration=None,
        default_sampling=model.default_sampling,
        decodes_padded=decodes_padded,
        precision=precision,
        native_kernels=(),
        takes_context=model.takes_context,
        sampling_fields=tuple(sorted(model.sampling_fields)),
        default_duration_s=model.default_duration_s,
        segments_text=model.segments_text,
        codes_as_ids=codes_as_ids,
    )
