"""The engine's real-time plan: the step budget, the first chunk's work, and the first chunk's
deadline, later for a prompt longer than the nominal one."""

from __future__ import annotations

from dataclasses import replace

import pytest

from cadenza.contract.step_time_model import StepTimeModel
from tests.support.contract_examples import TINY_PLAN

ROWS = StepTimeModel(0.0, 1.0, 0.0, prefill_ms_per_token=0.1)  # 0.1 ms a prompt row


def test_the_step_budget_and_the_first_chunks_work() -> None:
    assert TINY_PLAN.step_budget_s == pytest.approx(0.012)  # 13.3 ms less 10 %
    assert TINY_PLAN.first_chunk_work_s == pytest.approx(15 * 0.012)


def test_a_long_prompt_has_its_first_chunk_due_later_by_a_multiple_of_its_extra_prefill() -> None:
    assert TINY_PLAN.first_chunk_due_after_s(66, ROWS) == pytest.approx(0.3)  # nominal
    assert TINY_PLAN.first_chunk_due_after_s(10, ROWS) == pytest.approx(0.3)  # never sooner
    # 1,066 rows: 100 ms more than a nominal prompt to prefill, eight times over
    assert TINY_PLAN.first_chunk_due_after_s(1066, ROWS) == pytest.approx(0.3 + 0.8)
    strict = replace(TINY_PLAN, prompt_ttfa_multiple=0.0)
    assert strict.first_chunk_due_after_s(1066, ROWS) == pytest.approx(0.3)
    assert TINY_PLAN.first_chunk_due_after_s(1066, None) == pytest.approx(0.3)  # uncalibrated
