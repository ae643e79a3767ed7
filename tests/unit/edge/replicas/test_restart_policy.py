"""Restart backoff: doubling and capped within a streak of losses, a fresh streak after a
stable run, always a restart for an engine that became ready, and giving up (with the reason)
after too many failed starts in a row."""

from cadenza.config import SupervisionConfig
from cadenza.edge.replicas.restart_policy import STABLE_AFTER_S, RestartPolicy


def test_failed_starts_back_off_up_to_the_cap_then_give_up_with_the_reason() -> None:
    config = SupervisionConfig(
        restart_backoff_s=0.5, restart_backoff_max_s=3.0, max_start_failures=6
    )
    policy = RestartPolicy(config)
    delays = [policy.on_lost(float(t), "boom") for t in range(5)]
    assert delays == [0.5, 1.0, 2.0, 3.0, 3.0]
    assert policy.gave_up is None
    assert policy.on_lost(5.0, "still boom") is None
    assert policy.gave_up is not None and "6 times in a row" in policy.gave_up
    assert "still boom" in policy.gave_up


def test_an_engine_that_became_ready_is_always_restarted() -> None:
    policy = RestartPolicy(SupervisionConfig(restart_backoff_s=1.0, max_start_failures=2))
    now = 0.0
    for _ in range(10):  # killed right after every start: backoff grows, never gives up
        policy.on_ready(now)
        delay = policy.on_lost(now + 1.0, "killed")
        assert delay is not None
        now += 1.0 + delay
    assert policy.gave_up is None and delay == 30.0


def test_an_engine_that_ran_a_while_starts_a_new_streak() -> None:
    policy = RestartPolicy(SupervisionConfig(restart_backoff_s=1.0, max_start_failures=3))
    assert policy.on_lost(0.0, "crash") == 1.0
    policy.on_ready(1.0)
    assert policy.on_lost(2.0, "crash soon after") == 2.0  # not stable: same streak
    policy.on_ready(3.0)
    assert policy.on_lost(3.0 + STABLE_AFTER_S, "crash much later") == 1.0
    assert policy.losses_in_a_row == 1 and policy.gave_up is None
