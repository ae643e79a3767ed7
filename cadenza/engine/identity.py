"""The engine as the edge sees it: the :class:`EngineInfo` announced in ``ready``."""

from __future__ import annotations

from typing import TYPE_CHECKING

from cadenza.contract.engine_info import EngineInfo
from cadenza.contract.kv_memory import StreamShape
from cadenza.contract.realtime_plan import RealtimePlan
from cadenza.engine.models.model import AudioTokenModel
from cadenza.engine.realtime.plan import realtime_plan
from cadenza.kernels.native import loader

if TYPE_CHECKING:
    from cadenza.engine.engine import Engine


def shape_of(engine: Engine) -> StreamShape:
    """How the engine's streams use KV memory (what admission costs a stream with)."""
    layout = engine.layout
    return StreamShape(
        page_size=engine.kv.page_size,
        steps_per_frame=layout.steps_per_frame,
        tail_steps=layout.tail_steps,
        prompt_overhead_tokens=prompt_overhead_tokens(engine.model),
    )


def prompt_overhead_tokens(model: AudioTokenModel) -> int:
    """Prompt tokens besides the text's, for the model's longest voice (0 for a text LM)."""
    if not model.layout.produces_audio:
        return 0
    return max(len(model.build_prompt("", voice)) for voice in model.voices)


def plan_of(engine: Engine) -> RealtimePlan:
    """The engine's chunk plan and real-time targets (all zeros for a text model)."""
    audio = engine.layout.produces_audio
    return realtime_plan(
        engine.config.realtime,
        engine.frames,
        engine.layout,
        engine.frame_rate if audio else 0.0,
        engine.codec_lookahead_frames if audio else 0,
        shape_of(engine).nominal_prompt_tokens,
    )


def describe(engine: Engine) -> EngineInfo:
    audio = engine.layout.produces_audio
    return EngineInfo(
        model_name=engine.model_name,
        voices=engine.voices,
        sample_rate=engine.sample_rate if audio else 0,
        frame_rate=engine.frame_rate if audio else 0.0,
        device=str(engine.model.device),
        shape=shape_of(engine),
        kv_pages_total=engine.kv.pool.num_pages,
        max_num_seqs=engine.scheduler.max_num_seqs,
        realtime=engine.realtime_plan,
        calibration=engine.calibration,
        default_sampling=engine.model.default_sampling,
        decodes_padded=not engine.runner.fused_decode,
        precision=engine.precision,
        native_kernels=loader.report(),
    )
