"""The edge waits for a starting engine as long as it makes progress, and no longer."""

from __future__ import annotations

from cadenza.contract.messages import Starting
from cadenza.ipc.edge_side.start_deadline import StartDeadline


def test_progress_moves_the_deadline_and_silence_runs_it_out() -> None:
    deadline = StartDeadline(180.0, now=0.0)
    assert not deadline.expired(180.0) and deadline.expired(180.5)  # silent from the start
    # A calibration on a busy machine: ten minutes, CPU time growing all along.
    for second in range(1, 600):
        assert deadline.observe(Starting("calibrating (attempt 1 of 3)", 0.5 * second), second)
        assert not deadline.expired(second + 0.5)
    assert not deadline.expired(600.0)


def test_reports_without_cpu_time_are_no_progress() -> None:
    """An engine that reports but does nothing (blocked, deadlocked) is given up on."""
    deadline = StartDeadline(10.0, now=0.0)
    assert deadline.observe(Starting("loading", 2.0), 1.0)
    for second in range(2, 12):
        assert not deadline.observe(Starting("loading", 2.01), float(second))
    assert deadline.expired(11.5)
    assert "no progress for 10 s" in deadline.reason() and "loading" in deadline.reason()
    # A new stage counts, even before it has used CPU time.
    assert deadline.observe(Starting("calibrating (attempt 1 of 3)", 2.01), 12.0)
    assert not deadline.expired(21.0)
