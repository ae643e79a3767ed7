"""The plan an engine announces: its chunk sizes as it cuts them, the steps to its first
chunk, its targets; zeros for a text model."""

from __future__ import annotations

import pytest

from cadenza.config import RealtimeConfig
from cadenza.engine.chunk_policy import NO_FRAMES
from cadenza.engine.layouts.token_layout import PlainLayout
from cadenza.engine.realtime.plan import realtime_plan


def test_the_plan_of_cadenza_tiny_at_the_defaults(tiny_engine) -> None:
    plan = tiny_engine.info.realtime
    assert plan.step_period_s == pytest.approx(1 / 75)
    assert (plan.first_chunk_frames, plan.chunk_frames, plan.lookahead_frames) == (8, 15, 0)
    assert plan.first_chunk_steps == 8 + 7  # the delay pattern's last codebook lags 7 steps
    assert plan.nominal_prompt_rows == 64 + 2
    assert plan.ttfa_target_s == pytest.approx(0.3) and plan.max_lead_s == pytest.approx(1.5)
    assert tiny_engine.realtime_plan is tiny_engine.realtime_plan  # computed once


def test_a_text_model_has_no_real_time_plan() -> None:
    plan = realtime_plan(RealtimeConfig(), NO_FRAMES, PlainLayout(), 0.0, 0, 10)
    assert plan.step_period_s == 0.0 and plan.first_chunk_steps == 0
