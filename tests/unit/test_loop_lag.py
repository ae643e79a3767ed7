"""The event-loop lag probe: it sees a loop blocked by a synchronous call, names it in the log
and counts it as a stall; an idle loop records lags far below a stall."""

from __future__ import annotations

import asyncio
import logging
import threading
import time

import pytest

from cadenza.loop_lag import LoopLagProbe


def test_a_blocked_loop_is_a_stall_and_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    seen: list[float] = []

    async def scenario() -> LoopLagProbe:
        probe = LoopLagProbe("edge", interval_s=0.01, stall_s=0.1, observe=seen.append)
        task = probe.start()
        await asyncio.sleep(0.05)
        time.sleep(0.2)  # a synchronous call holds the loop
        await asyncio.sleep(0.05)
        task.cancel()
        return probe

    with caplog.at_level(logging.WARNING, logger="cadenza.loop_lag"):
        probe = asyncio.run(scenario())
    assert probe.stalls >= 1  # the one made here (a slow machine may add its own)
    assert probe.max_lag_s >= 0.15
    assert max(seen) == probe.max_lag_s and all(lag >= 0 for lag in seen)
    assert "edge's event loop stalled" in caplog.text


def test_an_idle_loop_has_no_stall() -> None:
    async def scenario() -> LoopLagProbe:
        probe = LoopLagProbe("load tester", interval_s=0.01)
        task = probe.start()
        await asyncio.sleep(0.1)
        task.cancel()
        return probe

    # The machine itself may stall once (a busy CI host): one quiet tenth of a second in three
    # tries shows the probe adds no lag of its own.
    probes = [asyncio.run(scenario()) for _ in range(3)]
    assert any(probe.stalls == 0 and probe.max_lag_s < 0.1 for probe in probes)


def test_record_clamps_early_wakeups() -> None:
    probe = LoopLagProbe("edge", stall_s=0.1)
    probe.record(-0.002)  # a timer may fire a hair early
    assert probe.max_lag_s == 0.0 and probe.stalls == 0
    probe.record(0.3)
    assert probe.stalls == 1 and probe.max_lag_s == 0.3


@pytest.mark.parametrize("bad", [{"interval_s": 0.0}, {"stall_s": -1.0}])
def test_nonsense_intervals_are_refused(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="must be positive"):
        LoopLagProbe("edge", **bad)


def _holds_the_loop() -> None:
    time.sleep(0.3)


def test_a_watched_loop_names_what_holds_it(caplog: pytest.LogCaptureFixture) -> None:
    async def scenario() -> None:
        probe = LoopLagProbe("edge", interval_s=0.01, stall_s=0.1, watch=True)
        task = probe.start()
        await asyncio.sleep(0.05)
        _holds_the_loop()
        await asyncio.sleep(0.05)
        task.cancel()

    with caplog.at_level(logging.WARNING, logger="cadenza.loop_lag"):
        asyncio.run(scenario())
    held = [r.getMessage() for r in caplog.records if "has been held" in r.getMessage()]
    assert any("_holds_the_loop" in message for message in held)
    assert not any(t.name == "edge-loop-watch" for t in threading.enumerate())
