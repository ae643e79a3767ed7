"""Which Bark streams rest: those whose lead over their listener covers the reserve and twice
what their next audio needs at a step of every live stream; none without audio, an unknown
need or a step time."""

from __future__ import annotations

import pytest

from cadenza.engine.models.bark.bark_playout import SAFETY, BarkPlayout


@pytest.fixture
def clock() -> list[float]:
    return [100.0]


@pytest.fixture
def playout(clock: list[float]) -> BarkPlayout:
    return BarkPlayout(reserve_s=0.1, clock=lambda: clock[0])


def test_a_listener_starts_with_the_first_audio_and_falls_behind_in_real_time(
    playout: BarkPlayout, clock: list[float]
) -> None:
    assert playout.lead_s(1) is None
    playout.delivered(1, 0.0)  # nothing heard yet
    assert playout.lead_s(1) is None
    playout.delivered(1, 6.8)
    clock[0] += 2.0
    playout.delivered(1, 1.0)
    assert playout.lead_s(1) == pytest.approx(5.8)
    playout.forget(1)
    assert playout.lead_s(1) is None


def test_streams_rest_while_their_lead_covers_their_next_audio(
    playout: BarkPlayout, clock: list[float]
) -> None:
    needs = {1: 50, 2: 50, 3: None}  # steps to the next audio; 3 is in its semantic stage
    for stream in (1, 3):
        playout.delivered(stream, 3.0)
    assert playout.resting(needs, needs.get) == {}  # no step time yet
    playout.observe_step(0.01, 2)  # 5 ms a stream: a step of all three takes 15 ms
    rest = playout.resting(needs, needs.get)
    assert set(rest) == {1}  # 2 has no audio yet, 3 an unknown need
    assert rest[1] == pytest.approx(3.0 - 0.1 - SAFETY * 50 * 0.015)
    clock[0] += rest[1]  # the listener has caught up that far: stream 1 goes on
    assert playout.resting(needs, needs.get) == {}
