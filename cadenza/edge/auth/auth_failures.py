"""Failed authentication, slowed down per address.

An address that fails :data:`MAX_FAILURES` times within :data:`WINDOW_S` seconds is refused
every credential check (valid or not) with 429 ``too_many_auth_failures`` until the oldest of
those failures leaves the window: guessing keys or forging tokens runs at
``MAX_FAILURES / WINDOW_S`` guesses per address at most, and a client that gets its key right
is never slowed. At most :data:`MAX_ADDRESSES` addresses are remembered (the longest-quiet are
forgotten first), so a flood of addresses costs bounded memory.
"""

from __future__ import annotations

import time
from collections import OrderedDict, deque

MAX_FAILURES = 10
WINDOW_S = 60.0
MAX_ADDRESSES = 10_000


class AuthFailures:
    """Failed attempts per address in a sliding window."""

    def __init__(
        self,
        max_failures: int = MAX_FAILURES,
        window_s: float = WINDOW_S,
        max_addresses: int = MAX_ADDRESSES,
    ) -> None:
        self.max_failures = max_failures
        self.window_s = window_s
        self.max_addresses = max_addresses
        self._failures: OrderedDict[str, deque[float]] = OrderedDict()

    def retry_after_s(self, address: str | None, now: float | None = None) -> float | None:
        """Seconds until ``address`` may try again, or ``None`` when it may now."""
        times = self._recent(address, time.monotonic() if now is None else now)
        if times is None or len(times) < self.max_failures:
            return None
        return max(times[0] + self.window_s - (time.monotonic() if now is None else now), 0.0)

    def failed(self, address: str | None, now: float | None = None) -> None:
        """Count a failed attempt from ``address``."""
        if address is None:
            return
        now = time.monotonic() if now is None else now
        times = self._recent(address, now)
        if times is None:
            times = self._failures[address] = deque(maxlen=self.max_failures)
            while len(self._failures) > self.max_addresses:
                self._failures.popitem(last=False)
        times.append(now)
        self._failures.move_to_end(address)

    def _recent(self, address: str | None, now: float) -> deque[float] | None:
        if address is None or (times := self._failures.get(address)) is None:
            return None
        while times and times[0] <= now - self.window_s:
            times.popleft()
        if not times:
            del self._failures[address]
            return None
        return times
