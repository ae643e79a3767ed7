"""Contract objects for tests of the edge: an engine's announcement and its reports, as a
cadenza-tiny engine would send them (no engine needed)."""

from __future__ import annotations

from cadenza.contract.calibration import Calibration
from cadenza.contract.engine_info import EngineInfo
from cadenza.contract.engine_stats import EngineStats, StepRecord, StepReport
from cadenza.contract.kv_memory import StreamShape
from cadenza.contract.messages import Stats
from cadenza.contract.native_kernels import NativeKernel
from cadenza.contract.precision import Precision
from cadenza.contract.realtime_plan import RealtimePlan
from cadenza.contract.step_time_model import StepSample, StepTimeModel

# 1 ms per decoding stream (+ nothing for context): 13.33 ms * 0.9 = 12 ms -> 12 streams.
STEP_MODEL = StepTimeModel(0.0, 1.0, 0.0, ((1, 400, 1.0), (32, 12800, 32.0)))

TINY_SHAPE = StreamShape(page_size=16, steps_per_frame=1, tail_steps=7, prompt_overhead_tokens=2)

# cadenza-tiny's plan at the default settings: 75 Hz, 8 + 7 steps to the first chunk.
TINY_PLAN = RealtimePlan(
    step_period_s=1 / 75,
    headroom=0.1,
    ttfa_target_s=0.3,
    playout_reserve_s=0.1,
    first_chunk_frames=8,
    first_chunk_steps=15,
    chunk_frames=15,
    lookahead_frames=0,
    max_lead_s=1.5,
    nominal_prompt_rows=66,
    prompt_ttfa_multiple=8.0,
)


PRECISION = Precision(
    weights="float32",
    products="bfloat16",
    kv_cache="bf16",
    codec="bfloat16",
    chosen_by="auto",
    lowered=("bfloat16 products", "bf16 KV cache", "bfloat16 codec"),
)

# What an engine on the development machine announces, and one on a machine without a compiler.
NATIVE_KERNELS = (
    NativeKernel("cpu_decode_layers", "native", "loaded", "avx512bf16"),
    NativeKernel("cpu_elu", "native", "loaded", "avx512bf16"),
)
NO_COMPILER_KERNELS = (
    NativeKernel(
        "cpu_decode_layers", "native", "no_compiler", detail="no c++, g++ or clang++ on PATH"
    ),
    NativeKernel("cpu_elu", "native", "no_compiler", detail="no c++, g++ or clang++ on PATH"),
)


def engine_info(
    kv_pages: int = 100_000,
    max_num_seqs: int = 64,
    calibrated: bool = True,
    native_kernels: tuple[NativeKernel, ...] = NATIVE_KERNELS,
) -> EngineInfo:
    calibration = Calibration(
        STEP_MODEL, (StepSample(1, 400, 1.0), StepSample(32, 12800, 32.0)), 0.2, "cpu", "x", 1.0
    )
    return EngineInfo(
        model_name="cadenza-tiny",
        voices=("default",),
        sample_rate=24000,
        frame_rate=75.0,
        device="cpu",
        shape=TINY_SHAPE,
        kv_pages_total=kv_pages,
        max_num_seqs=max_num_seqs,
        realtime=TINY_PLAN,
        calibration=calibration if calibrated else None,
        precision=PRECISION,
        native_kernels=native_kernels,
    )


def engine_stats(
    correction: float = 1.0, kv_pages_free: int = 1000, spare_lead_s: float | None = None
) -> EngineStats:
    return EngineStats(
        num_running=4,
        num_waiting=0,
        max_num_seqs=64,
        kv_pages_total=100_000,
        kv_pages_free=kv_pages_free,
        num_preemptions=0,
        prefix_hit_tokens=0,
        prefix_query_tokens=0,
        skipped_steps=0,
        step_correction=correction,
        spare_lead_s=spare_lead_s,
    )


def stats_message(correction: float = 1.0, slack_ms: list[float] | None = None) -> Stats:
    report = StepReport(
        steps=(StepRecord(0.005, 4, 4, 400),),
        chunk_slack_s=tuple(ms / 1000.0 for ms in slack_ms or []),
    )
    return Stats(engine_stats(correction), report)


def timed_stats(slower: float, steps: int = 15) -> Stats:
    """A report of ``steps`` decode steps of 4 streams that each took ``slower`` times what
    :data:`STEP_MODEL` predicts (4 ms)."""
    record = StepRecord(0.004 * slower, 4, 4, 400)
    return Stats(engine_stats(), StepReport(steps=(record,) * steps))
