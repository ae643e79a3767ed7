"""What the engine announces once, in its ``ready`` message: the model's identity, how its
streams use memory and time, and how much it holds."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated

from pydantic import Field

from cadenza.contract.calibration import Calibration
from cadenza.contract.kv_memory import StreamShape
from cadenza.contract.native_kernels import NativeKernel
from cadenza.contract.precision import Precision
from cadenza.contract.realtime_plan import RealtimePlan
from cadenza.contract.sampling import SamplingParams


@dataclass(frozen=True)
class EngineInfo:
    """``kv_pages_total``: pages in the engine's KV pool (``max`` int for an engine without
    one); ``max_num_seqs``: streams it runs at once; ``realtime``: its chunk plan and
    real-time targets (every duration admission weighs); ``calibration``: its measured step-time
    model, ``None`` when calibration is off (then admission counts only memory and
    ``max_num_seqs``); ``decodes_padded``: whether a decode step's attention costs every
    stream the longest one's context (else each its own: a step costs their sum); ``precision``:
    the dtypes it computes in (``None``: an engine that does not say); ``native_kernels``: each
    native CPU kernel library, loaded or not, for which instruction set (empty: an engine that
    reports none); ``takes_context``: the model builds prompts from earlier turns (Sesame CSM, Dia),
    which conversations and text streams send it; ``sampling_fields``: the model-specific
    sampling fields the model takes (:data:`~cadenza.contract.sampling.MODEL_SAMPLING_FIELDS`;
    the edge refuses the others by name); ``default_duration_s``: a model whose text does not
    set its length (a music model's description) has this long a stream unless the request's
    ``max_duration_s`` says otherwise (``None``: the length follows the text,
    :mod:`cadenza.contract.stream_length`); ``segments_text``: the model speaks a text longer
    than one sentence as consecutive segments, one sentence each (Bark's long-form recipe), so
    that its first audio comes after the first sentence; ``codes_as_ids``: its codec frames
    are ids of at most 16 bits, which the ``encodec`` format sends (a model of continuous
    latents has none)."""

    model_name: str
    voices: tuple[str, ...]
    sample_rate: int
    frame_rate: float
    device: str
    shape: StreamShape
    kv_pages_total: int
    max_num_seqs: int
    realtime: RealtimePlan
    calibration: Calibration | None = None
    default_sampling: SamplingParams = field(default_factory=SamplingParams)
    decodes_padded: bool = True
    precision: Precision | None = None
    native_kernels: Annotated[tuple[NativeKernel, ...], Field(max_length=64)] = ()
    takes_context: bool = False
    sampling_fields: tuple[str, ...] = ()
    default_duration_s: float | None = None
    segments_text: bool = False
    codes_as_ids: bool = True

    @property
    def frame_period_s(self) -> float:
        return 1.0 / self.frame_rate
