"""The chaos schedule's parsing and the chaos summary: completion share, gaps, times to ready."""

import random
import subprocess

import pytest

from cadenza.loadtest.chaos import ChaosSchedule, Kill, _kill_a_node, summarize_chaos
from cadenza.loadtest.level_summary import StreamResult
from cadenza.loadtest.playout import Playout, Underrun
from cadenza.loadtest.workload import WorkloadError


def test_schedules_parse_and_garbage_is_refused() -> None:
    assert ChaosSchedule.parse("20-30") == ChaosSchedule(20.0, 30.0)
    assert ChaosSchedule.parse("5") == ChaosSchedule(5.0, 5.0)
    for bad in ("", "soon", "30-20", "0-1", "-5", "1-x"):
        with pytest.raises(WorkloadError, match="--chaos-kill-every"):
            ChaosSchedule.parse(bad)


def test_the_summary_counts_broken_streams_and_the_gaps_heard() -> None:
    gap = Playout(3.0, 0.4, 0.4, (Underrun(1.0, 0.4),))
    smooth = Playout(3.0, 0.0, 0.0)
    results = [
        StreamResult("served", 0.0, playout=gap),
        StreamResult("served", 0.5, playout=smooth),
        StreamResult("error", 1.0, reason="engine_unavailable", broken=True),
        StreamResult("refused", 1.5, reason="queue_timeout"),  # never started: not counted
    ]
    kills = [Kill(4.0, "m", 0, 11, ready_after_s=2.5), Kill(9.0, "m", 1, 12)]
    chaos = summarize_chaos(kills, results)
    assert chaos["kills"] == 2 and chaos["time_to_ready_s"] == {
        "p50": 2.5,
        "max": 2.5,
        "not_back": 1,
    }
    assert chaos["streams_started"] == 3 and chaos["completed_share"] == pytest.approx(2 / 3, 1e-4)
    assert chaos["broken_by_reason"] == {"engine_unavailable": 1}
    assert chaos["gaps_ms"] == {"count": 1, "p50": 400.0, "p99": 400.0, "max": 400.0}


def test_whole_nodes_to_kill_parse_and_garbage_is_named() -> None:
    assert ChaosSchedule.parse("5", "123,-456").nodes == (123, -456)
    for bad in ("", "abc", "1,x", "0", "-1", "+5", "12,,13"):
        with pytest.raises(WorkloadError, match="--chaos-kill-nodes"):
            ChaosSchedule.parse("5", bad)


def test_a_node_is_killed_with_its_whole_process_group() -> None:
    """A negative target is a process group: the node's parent and its children die at once."""
    node = subprocess.Popen(["sh", "-c", "sleep 60 & sleep 60; wait"], start_new_session=True)
    try:
        index, killed = _kill_a_node((-node.pid,), [], random.Random(0))
        assert (index, killed) == (0, -node.pid)
        assert node.wait(timeout=10) == -9
        assert (
            _kill_a_node((-node.pid,), [Kill(0.0, "(node)", 0, -node.pid)], random.Random(0))
            is None
        )
    finally:
        if node.poll() is None:
            node.kill()
