"""The engine's prompt order replayed at the edge: what is left of each admitted prompt, when
each is done by deadline, and whom a new prompt would make late."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cadenza.edge.admission.prefill_schedule import (
    Prompt,
    finish_times,
    lateness_s,
    remaining_ms,
)


def test_prompts_are_prefilled_earliest_deadline_first_even_when_released_later() -> None:
    long = Prompt(released_s=0.0, work_ms=300.0, due_s=1.0)
    short = Prompt(released_s=0.1, work_ms=20.0, due_s=0.3)
    # From 0 to 0.1 s the long one ran alone (100 ms); then the short one went first (20 ms).
    assert remaining_ms([long, short], rate=1.0, now_s=0.15) == pytest.approx([170.0, 0.0])
    assert remaining_ms([long, short], rate=0.5, now_s=0.1) == pytest.approx([250.0, 20.0])
    assert remaining_ms([long, short], rate=0.0, now_s=5.0) == [300.0, 20.0]


def test_finish_times_follow_the_deadlines_and_the_lead_lent_at_once() -> None:
    a = Prompt(0.0, 100.0, due_s=0.5)
    b = Prompt(0.0, 50.0, due_s=0.2)
    assert finish_times([a, b], [100.0, 50.0], 1.0, 0.0, 0.0) == pytest.approx([0.15, 0.05])
    assert finish_times([a, b], [100.0, 50.0], 1.0, 60.0, 0.0) == pytest.approx([0.09, 0.0])
    assert finish_times([a, b], [0.0, 50.0], 0.5, 0.0, 1.0) == pytest.approx([1.0, 1.1])


def test_a_new_prompt_is_blamed_only_for_what_it_makes_late() -> None:
    hopeless = Prompt(0.0, 500.0, due_s=0.1)  # late whatever comes next
    on_time = Prompt(0.0, 100.0, due_s=0.7)
    new = Prompt(0.0, 100.0, due_s=0.3)  # goes ahead of on_time, by its deadline
    # by deadline: hopeless (0.5 s), new (0.6 s: 0.3 s late), on_time (0.7 s: just on time)
    assert lateness_s([hopeless, on_time], new, 1.0, 0.0, 0.0) == pytest.approx(0.3)
    relaxed = Prompt(0.0, 100.0, due_s=0.65)  # first (0.1 s), on_time next (0.2 s of 0.7)
    assert lateness_s([on_time], relaxed, 1.0, 0.0, 0.0) == pytest.approx(0.2 - 0.7)
    pushed = Prompt(0.0, 100.0, due_s=0.15)
    # new first (0.1 s), then on_time (0.2 s) still fine: fits
    assert lateness_s([on_time], pushed, 1.0, 0.0, 0.0) < 0


@given(
    st.lists(
        st.tuples(
            st.floats(0, 1), st.floats(0, 200), st.floats(0, 2)
        ),  # released, work, due after release
        max_size=8,
    ),
    st.floats(0.05, 1.0),
    st.floats(0, 3),
)
def test_work_is_never_created_or_lost(raw, rate, now_s) -> None:
    prompts = [Prompt(r, w, r + d) for r, w, d in raw]
    left = remaining_ms(prompts, rate, now_s)
    assert all(0.0 <= rest <= p.work_ms + 1e-9 for rest, p in zip(left, prompts, strict=True))
    done = sum(p.work_ms for p in prompts) - sum(left)
    first = min((p.released_s for p in prompts), default=now_s)
    assert done <= 1000.0 * rate * max(now_s - first, 0.0) + 1e-6
    finish = finish_times(prompts, left, rate, 0.0, now_s)
    assert all(f >= now_s for f in finish)
