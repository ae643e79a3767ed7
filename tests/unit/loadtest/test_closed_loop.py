"""A closed-loop virtual user is a listener: its next utterance starts once it has heard the
last one to its end; with ``back_to_back`` as soon as the last chunk has arrived. The users' first
requests are spread over ``ramp_s``."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import random
import time

import pytest

from cadenza.loadtest import level_runner
from cadenza.loadtest.level_runner import _loop
from cadenza.loadtest.level_summary import StreamResult
from cadenza.loadtest.playout import Playout
from cadenza.loadtest.workload import LoadOptions, WorkloadError

PLAYS_S = 0.3  # how long after its last chunk each fake utterance still plays


def _starts(back_to_back: bool, offer_s: float) -> list[float]:
    """When a fake runner was asked for each utterance, within ``offer_s`` of offering."""
    options = LoadOptions("http://127.0.0.1:1", back_to_back=back_to_back)
    asked: list[float] = []

    async def runner(text: str, start: float, seed: int) -> StreamResult:
        asked.append(time.monotonic())
        playout = Playout(1.0, 0.0, 0.0, ends_s=time.monotonic() + PLAYS_S)
        return StreamResult("served", 0.0, ttfa_s=0.1, playout=playout)

    async def run() -> None:
        now = time.monotonic()
        await _loop(options, random.Random(0), now, now + offer_s, [], runner)

    asyncio.run(run())
    return asked


def test_a_listener_asks_again_only_after_its_playback_ends() -> None:
    asked = _starts(back_to_back=False, offer_s=0.7)
    assert len(asked) == 3  # at 0, 0.3 and 0.6 s
    assert all(b - a >= PLAYS_S for a, b in itertools.pairwise(asked))


def test_back_to_back_users_ask_again_at_once() -> None:
    asked = _starts(back_to_back=True, offer_s=0.05)
    assert len(asked) > 10
    assert max(b - a for a, b in itertools.pairwise(asked)) < PLAYS_S


def test_the_first_requests_are_spread_evenly_over_the_ramp(monkeypatch) -> None:
    options = LoadOptions("http://127.0.0.1:1", transport="http", ramp_s=0.4, duration_s=1.0)
    asked: list[float] = []

    async def runner(text: str, start: float, seed: int) -> StreamResult:
        asked.append(time.monotonic() - start)
        await asyncio.sleep(10.0)  # one utterance each: it outlasts the offering
        return StreamResult("served", 0.0)

    monkeypatch.setattr(level_runner, "_http_runner", lambda http, options: runner)

    async def run() -> None:
        start = time.monotonic()
        users = [
            level_runner._virtual_user(options, None, 0.5, user / 4, start, start + 0.6, [])  # type: ignore[arg-type]
            for user in range(4)
        ]
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.gather(*users), timeout=0.8)

    asyncio.run(run())
    assert sorted(asked) == pytest.approx([0.0, 0.1, 0.2, 0.3], abs=0.05)


@pytest.mark.parametrize("ramp_s", [-0.1, 20.0, float("nan")])
def test_a_ramp_outside_the_level_is_refused(ramp_s: float) -> None:
    with pytest.raises(WorkloadError, match="--ramp-s"):
        LoadOptions("http://127.0.0.1:1", ramp_s=ramp_s, duration_s=20.0)
