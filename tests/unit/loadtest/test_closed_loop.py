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


def _starts(back_to_back: bool, offer_s: float, plays_s: float = PLAYS_S) -> list[float]:
    """When a fake runner was asked for each utterance, within ``offer_s`` of offering; each
    fake utterance still plays ``plays_s`` after its last chunk."""
    options = LoadOptions("http://127.0.0.1:1", back_to_back=back_to_back)
    asked: list[float] = []

    async def runner(text: str, start: float, seed: int) -> StreamResult:
        asked.append(time.monotonic())
        playout = Playout(1.0, 0.0, 0.0, ends_s=time.monotonic() + plays_s)
        return StreamResult("served", 0.0, ttfa_s=0.1, playout=playout)

    async def run() -> None:
        now = time.monotonic()
        await _loop(options, random.Random(0), now, now + offer_s, [], runner)

    asyncio.run(run())
    return asked


def test_a_listener_asks_again_only_after_its_playback_ends() -> None:
    asked = _starts(back_to_back=False, offer_s=0.7)
    assert 2 <= len(asked) <= 3  # at 0, 0.3 and (unless the machine stalls) 0.6 s
    assert all(b - a >= PLAYS_S for a, b in itertools.pairwise(asked))


def test_back_to_back_users_ask_again_at_once() -> None:
    # Each utterance plays for a minute: a user waiting for it would ask once in the offering.
    asked = _starts(back_to_back=True, offer_s=0.05, plays_s=60.0)
    assert len(asked) > 10
    assert max(b - a for a, b in itertools.pairwise(asked)) < 60.0


def test_the_first_requests_are_spread_evenly_over_the_ramp(monkeypatch) -> None:
    options = LoadOptions("http://127.0.0.1:1", transport="http", ramp_s=0.8, duration_s=2.0)
    asked: list[float] = []

    async def runner(text: str, start: float, seed: int) -> StreamResult:
        asked.append(time.monotonic() - start)
        await asyncio.sleep(10.0)  # one utterance each: it outlasts the offering
        return StreamResult("served", 0.0)

    monkeypatch.setattr(level_runner, "_http_runner", lambda http, options: runner)

    async def run() -> None:
        start = time.monotonic()
        users = [
            level_runner._virtual_user(options, None, 0.5, user / 4, start, start + 1.0, [])  # type: ignore[arg-type]
            for user in range(4)
        ]
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.gather(*users), timeout=1.2)

    asyncio.run(run())
    assert sorted(asked) == pytest.approx([0.0, 0.2, 0.4, 0.6], abs=0.1)


@pytest.mark.parametrize("ramp_s", [-0.1, 20.0, float("nan")])
def test_a_ramp_outside_the_level_is_refused(ramp_s: float) -> None:
    with pytest.raises(WorkloadError, match="--ramp-s"):
        LoadOptions("http://127.0.0.1:1", ramp_s=ramp_s, duration_s=20.0)


def test_a_websocket_user_whose_session_was_lost_connects_again(monkeypatch) -> None:
    """An utterance that ends with ``connection_lost`` (its node died and it could not
    resume) is counted, and the user goes on over a new connection."""
    options = LoadOptions("http://127.0.0.1:1", transport="ws", duration_s=1.0)
    sessions: list[object] = []
    outcomes = iter(["connection_lost", None, None])

    @contextlib.asynccontextmanager
    async def connect(*args, **kwargs):
        session = object()
        sessions.append(session)
        yield session

    async def ws_stream(session, text, options, start, seed) -> StreamResult:
        await asyncio.sleep(0.01)
        reason = next(outcomes, None)
        return StreamResult("error" if reason else "served", 0.0, reason=reason)

    monkeypatch.setattr(level_runner, "connect", connect)
    monkeypatch.setattr(level_runner, "ws_stream", ws_stream)
    results: list[StreamResult] = []

    async def run() -> None:
        start = time.monotonic()
        await level_runner._virtual_user(options, None, 0.5, 0.0, start, start + 0.2, results)  # type: ignore[arg-type]

    asyncio.run(run())
    assert len(sessions) == 2
    assert results[0].reason == "connection_lost" and results[1].outcome == "served"
