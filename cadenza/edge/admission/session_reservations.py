"""Streams promised to WebSocket sessions between their upgrade and their first utterance's
admission (docs/scaling.md, "Spilling to another node").

A WebSocket is accepted before its utterances are admitted. A node that checks at the upgrade
whether it could start one more stream at once must count the sessions it has just accepted
whose first ``speak`` has not reached admission yet: otherwise every upgrade of a burst that
arrives together sees the same free slot, and all of them pass. Each accepted session that
found room holds a :class:`Reservation` until its first utterance reaches admission (admitted,
queued or refused), the session ends, or ``hold_s`` passes: a session that has not spoken by
then was not about to start a stream, and its slot goes back to whoever asks next.

The node's agent (``cadenza serve --agent-port``) counts reservations as taken, so the front
door's weights fall with sessions being set up, not only with streams playing.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

HOLD_S = 5.0  # a client speaks within a round trip of its ``ready``; an idle one lets go


@dataclass(eq=False)
class Reservation:
    """One session's promised stream; it counts until released or ``expires_at`` (monotonic
    seconds), whichever comes first."""

    expires_at: float


class SessionReservations:
    """The node's reservations. ``clock``: monotonic seconds (a test's own)."""

    def __init__(self, hold_s: float = HOLD_S, clock: Callable[[], float] = time.monotonic) -> None:
        if hold_s <= 0:
            raise ValueError(f"hold_s must be > 0, got {hold_s!r}")
        self.hold_s = hold_s
        self.clock = clock
        self._held: set[Reservation] = set()

    @property
    def pending(self) -> int:
        """Reservations held now (the lapsed ones are let go first)."""
        now = self.clock()
        self._held = {r for r in self._held if r.expires_at > now}
        return len(self._held)

    def reserve(self, free_streams: int) -> Reservation | None:
        """A reservation when the node's ``free_streams`` (streams it would still admit now,
        reservations not counted) exceed the reservations held; ``None`` when every free
        stream is promised already."""
        if free_streams - self.pending <= 0:
            return None
        reservation = Reservation(self.clock() + self.hold_s)
        self._held.add(reservation)
        return reservation

    def release(self, reservation: Reservation | None) -> None:
        """The session's first utterance reached admission, or the session ended (``None``,
        and a reservation released or lapsed before, are fine)."""
        if reservation is not None:
            self._held.discard(reservation)

    def check_integrity(self) -> None:
        """Every reservation held expires within ``hold_s`` from now."""
        now = self.clock()
        for reservation in self._held:
            assert reservation.expires_at <= now + self.hold_s, reservation
