"""The capacity model: KV and real-time limits from the engine's numbers, closing on slack."""

from __future__ import annotations

import pytest

from cadenza.admission.capacity import CapacityModel, StreamCost
from cadenza.config import AdmissionConfig, EngineConfig
from cadenza.engine.messages import EngineInfo
from cadenza.engine.step_time_model import StepTimeModel

# 1 ms per decoding stream (+ nothing for context): 13.33 ms * 0.9 = 12 ms -> 12 streams.
MODEL = StepTimeModel(0.0, 1.0, 0.0, ((1, 400, 1.0), (32, 12800, 32.0)))


def info(kv_blocks: int = 100_000, max_num_seqs: int = 64, calibrated: bool = True) -> EngineInfo:
    return EngineInfo(
        model_name="cadenza-tiny",
        voices=("default",),
        sample_rate=24000,
        frame_rate=75.0,
        device="cpu",
        steps_per_frame=1,
        block_size=16,
        kv_blocks_total=kv_blocks,
        max_num_seqs=max_num_seqs,
        calibration={"model": MODEL.to_dict()} if calibrated else None,
    )


class Clock:
    now = 0.0

    def __call__(self) -> float:
        return self.now


def stats(correction: float = 1.0, slack_ms: list[float] | None = None) -> dict[str, object]:
    return {
        "step_s": [0.005],
        "step_decodes": [4],
        "chunk_slack_ms": slack_ms or [],
        "engine": {"step_correction": correction, "kv_blocks_free": 1000},
    }


def test_realtime_limit_follows_the_model_and_its_correction() -> None:
    model = CapacityModel(info(), EngineConfig(), AdmissionConfig())
    assert model.step_budget_ms == pytest.approx(1000 / 75 * 0.9)
    assert model.realtime_limit() == 12
    assert model.max_streams() == 12
    model.observe(stats(correction=2.0))  # steps take twice what was calibrated
    assert model.realtime_limit() == 6
    assert model.refusal(6, 0, StreamCost(10, 3.0)) == "realtime_budget"
    assert model.refusal(5, 0, StreamCost(10, 3.0)) is None
    model.observe(stats(correction=100.0))  # no stream fits the budget any more...
    assert model.realtime_limit() == 0
    assert model.refusal(0, 0, StreamCost(10, 3.0)) is None  # ...but an idle server admits one
    assert model.refusal(1, 0, StreamCost(10, 3.0)) == "realtime_budget"


def test_kv_memory_and_max_num_seqs_limit_too() -> None:
    model = CapacityModel(info(kv_blocks=200, max_num_seqs=3), EngineConfig(), AdmissionConfig())
    nominal = model.stream_cost("x" * 64, 10.0)
    assert model.kv_limit() == 200 // nominal.kv_pages
    assert model.max_streams() == min(model.kv_limit(), 3)
    assert model.refusal(0, 190, StreamCost(20, 1.0)) == "kv_memory"
    assert model.refusal(3, 0, StreamCost(1, 1.0)) in ("max_streams", "realtime_budget")


def test_stream_cost_counts_prompt_and_output_pages() -> None:
    model = CapacityModel(info(), EngineConfig(), AdmissionConfig())
    cost = model.stream_cost("a" * 100, 2.0)
    # 100 text bytes + 16 overhead + (150 frames + 8) steps = 274 tokens -> 18 pages of 16.
    assert cost == StreamCost(18, 2.0)
    assert model.stream_cost("a" * 100, 2.0, prompt_audio_s=1.0).kv_pages == 22  # + 75 frames


def test_slipping_deadlines_close_admission_until_slack_recovers() -> None:
    clock = Clock()
    config = AdmissionConfig(slack_close_ms=30.0, slack_reopen_s=2.0)
    model = CapacityModel(info(), EngineConfig(), config, clock=clock)
    model.observe(stats(slack_ms=[120.0, 80.0]))
    assert model.admission_open
    model.observe(stats(slack_ms=[120.0, 10.0]))  # one chunk nearly late
    assert not model.admission_open
    assert model.refusal(2, 0, StreamCost(1, 1.0)) == "deadlines_slipping"
    assert model.refusal(0, 0, StreamCost(1, 1.0)) is None  # an idle server always admits one
    clock.now = 1.0
    model.observe(stats(slack_ms=[150.0]))
    assert not model.admission_open
    clock.now = 2.5
    assert model.admission_open


def test_uncalibrated_engines_admit_by_memory_and_slots_only() -> None:
    model = CapacityModel(info(calibrated=False, max_num_seqs=7), EngineConfig(), AdmissionConfig())
    assert model.realtime_limit() == 7
    assert model.max_streams() == 7
    assert model.rtf_headroom(0) == pytest.approx(1.0)
