"""Open streams per credential: ``limits.max_streams_per_client``.

A credential (a principal's ``holder``: an API key, a client token, an address on an open
server) may hold at most ``limits.max_streams_per_client`` streams at once (0: any). A stream
counts from admission, while it queues too, until its lease ends, however it ends; one over the
limit is refused with 429 ``too_many_streams`` before it queues. Each stream is counted by its
id (its request id, which a resumed stream keeps), so a stream counted twice counts once.

:class:`NodeStreams` counts this node's streams; with ``limits.redis_url`` the count is the
fleet's, in Redis (:mod:`~cadenza.edge.admission.shared_client_streams`). Admission reads
either through :class:`ClientStreams`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


class TooManyStreams(Exception):
    """The holder has as many streams open as it may."""

    def __init__(self, limit: int) -> None:
        super().__init__(
            f"this client already has {limit} stream(s) open, the most it may have at once "
            "(limits.max_streams_per_client); end one first"
        )
        self.limit = limit


@dataclass(eq=False)
class StreamSlot:
    """One open stream of ``holder``, counted until :meth:`ClientStreams.release`.
    ``shared``: its entry is in the fleet's count (else, so far, only in this node's)."""

    holder: str
    stream_id: str
    shared: bool = False
    released: bool = False


class ClientStreams(Protocol):
    """The open streams per holder that admission counts, this node's or the fleet's."""

    async def acquire(self, holder: str, stream_id: str) -> StreamSlot:
        """Count stream ``stream_id`` for ``holder`` (once, however often it is counted).
        Raises :class:`TooManyStreams` (counting nothing) when the holder has as many open
        as it may, :class:`~cadenza.edge.admission.rate_limit.QuotasUnavailable` when the
        count cannot be read and admission must not go on without it."""
        ...

    def release(self, slot: StreamSlot) -> bool:
        """The stream ended: it no longer counts. ``True`` when it counted until now (a second
        release, or that of a slot a resume replaced on this node, does nothing)."""
        ...

    async def aclose(self) -> None:
        """Stop: let the releases in flight finish briefly, close connections."""
        ...


class NodeStreams:
    """This node's open streams per holder (``limit`` 0: any, and none is tracked)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._open: dict[str, dict[str, StreamSlot]] = {}

    async def acquire(self, holder: str, stream_id: str) -> StreamSlot:
        """:meth:`admit` (this node's count answers at once)."""
        return self.admit(holder, stream_id)

    def admit(self, holder: str, stream_id: str, *, check: bool = True) -> StreamSlot:
        """Count ``stream_id`` for ``holder``; raises :class:`TooManyStreams` when it would be
        one over the limit (``check=False``: the fleet's count has admitted it; keep it).
        A stream already counted here is counted once: its new slot replaces the old one,
        whose release is then a no-op."""
        slot = StreamSlot(holder, stream_id)
        if self.limit == 0:
            return slot
        streams = self._open.get(holder, {})
        if check and stream_id not in streams and len(streams) >= self.limit:
            raise TooManyStreams(self.limit)
        streams[stream_id] = slot
        self._open[holder] = streams
        return slot

    def release(self, slot: StreamSlot) -> bool:
        """``slot``'s stream ended; ``True`` when it was counted here until now."""
        slot.released = True
        streams = self._open.get(slot.holder)
        if streams is None or streams.get(slot.stream_id) is not slot:
            return False
        del streams[slot.stream_id]
        if not streams:
            del self._open[slot.holder]
        return True

    async def aclose(self) -> None:
        """Nothing to close."""

    def count(self, holder: str) -> int:
        """``holder``'s streams open on this node."""
        return len(self._open.get(holder, ()))

    def open_slots(self) -> list[StreamSlot]:
        """Every stream counted here."""
        return [slot for streams in self._open.values() for slot in streams.values()]

    def check_integrity(self) -> None:
        """No holder without streams; every slot filed under its own holder and id, and not
        released."""
        for holder, streams in self._open.items():
            assert streams, holder
            for stream_id, slot in streams.items():
                assert (slot.holder, slot.stream_id) == (holder, stream_id)
                assert not slot.released
