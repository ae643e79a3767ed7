"""Streams reserved for WebSocket sessions between their upgrade and their first utterance's
admission: as many as the node has free, no more; given back when released or after the hold;
random sequences keep the count within what was free."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cadenza.edge.admission.session_reservations import Reservation, SessionReservations


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_burst_reserves_each_free_stream_once() -> None:
    """Three free streams: three upgrades of a burst get one each, the fourth none (while
    nothing was admitted yet, each upgrade sees the same three free streams)."""
    reservations = SessionReservations(hold_s=5.0, clock=Clock())
    held = [reservations.reserve(free_streams=3) for _ in range(4)]
    assert all(isinstance(r, Reservation) for r in held[:3]) and held[3] is None
    assert reservations.pending == 3
    reservations.check_integrity()


def test_a_release_gives_the_stream_back_once() -> None:
    reservations = SessionReservations(hold_s=5.0, clock=Clock())
    first = reservations.reserve(free_streams=1)
    assert first is not None and reservations.reserve(free_streams=1) is None
    reservations.release(first)
    reservations.release(first)  # a second release and a release of None change nothing
    reservations.release(None)
    assert reservations.pending == 0
    assert reservations.reserve(free_streams=1) is not None


def test_a_session_that_does_not_speak_lets_go_after_the_hold() -> None:
    clock = Clock()
    reservations = SessionReservations(hold_s=5.0, clock=clock)
    idle = reservations.reserve(free_streams=1)
    clock.now += 4.9
    assert reservations.pending == 1 and reservations.reserve(free_streams=1) is None
    clock.now += 0.2
    assert reservations.pending == 0
    assert reservations.reserve(free_streams=1) is not None
    reservations.release(idle)  # released after it lapsed: nothing else is let go
    assert reservations.pending == 1


def test_no_free_stream_reserves_nothing() -> None:
    reservations = SessionReservations(clock=Clock())
    assert reservations.reserve(free_streams=0) is None
    assert reservations.reserve(free_streams=-2) is None
    assert reservations.pending == 0


@pytest.mark.parametrize("hold_s", [0.0, -1.0])
def test_a_hold_that_is_not_positive_is_refused(hold_s: float) -> None:
    with pytest.raises(ValueError, match="hold_s"):
        SessionReservations(hold_s=hold_s)


OPERATIONS = st.lists(
    st.one_of(
        st.tuples(st.just("reserve"), st.integers(-2, 6)),
        st.tuples(st.just("release"), st.integers(0, 20)),
        st.tuples(st.just("wait"), st.floats(0.0, 3.0)),
    ),
    max_size=60,
)


@given(OPERATIONS)
def test_random_sequences_never_hold_more_than_was_free(operations) -> None:
    """After each reservation granted against ``free`` streams, at most ``free`` are held; a
    refused one means ``free`` were held already; releases and lapses only lower the count."""
    clock = Clock()
    reservations = SessionReservations(hold_s=5.0, clock=clock)
    granted: list[Reservation] = []
    for kind, value in operations:
        before = reservations.pending
        if kind == "reserve":
            reservation = reservations.reserve(free_streams=int(value))
            if reservation is None:
                assert before >= value
            else:
                granted.append(reservation)
                assert reservations.pending == before + 1 <= value
        elif kind == "release":
            if granted:
                reservations.release(granted[int(value) % len(granted)])
            assert reservations.pending <= before
        else:
            clock.now += value
            assert reservations.pending <= before
        reservations.check_integrity()
