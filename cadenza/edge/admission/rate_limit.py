"""Per-client token buckets with two costs: requests, and seconds of audio.

A request takes one request token and the audio it may produce at most (estimated from its text
and ``max_duration_s``) in audio tokens; when it ends, what it did not use is given back
(:meth:`RateLimiter.settle`). Each bucket holds one minute's allowance and refills continuously.
A refusal says how long until the bucket would allow the request (``Retry-After``). A rate of 0
means unlimited.

:class:`RateLimiter` keeps the buckets of this node; with ``limits.redis_url`` the buckets are
the fleet's, in Redis (:mod:`~cadenza.edge.admission.shared_rate_limit`). Admission reads
either through :class:`Quotas`.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

MAX_CLIENTS = 10_000  # least recently seen clients beyond this are forgotten (full buckets)


class RateLimited(Exception):
    def __init__(self, reason: str, retry_after_s: float) -> None:
        super().__init__(f"{reason} rate limit reached; retry in {retry_after_s:.1f} s")
        self.reason = reason
        self.retry_after_s = retry_after_s


class QuotasUnavailable(Exception):
    """The fleet's buckets cannot be read and the configuration says not to admit without
    them (``limits.redis_failure = "closed"``)."""

    def __init__(self, message: str, retry_after_s: float) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class TokenBucket:
    def __init__(self, per_minute: float, now: float) -> None:
        self.capacity = per_minute
        self.refill_per_s = per_minute / 60.0
        self.tokens = per_minute
        self.updated = now

    def _refill(self, now: float) -> None:
        self.tokens = min(self.capacity, self.tokens + (now - self.updated) * self.refill_per_s)
        self.updated = now

    def wait_s(self, cost: float, now: float) -> float:
        """Seconds until ``cost`` tokens are available (0: now). A cost above the capacity
        is treated as the capacity, so a long request is slowed, never refused forever."""
        self._refill(now)
        missing = min(cost, self.capacity) - self.tokens
        return max(0.0, missing / self.refill_per_s)

    def take(self, cost: float) -> None:
        self.tokens -= cost

    def give_back(self, amount: float) -> None:
        self.tokens = min(self.capacity, self.tokens + amount)


@dataclass
class Grant:
    """What a request was charged: one request token and ``audio_s`` seconds, in the fleet's
    buckets (``shared``) or this node's."""

    client: str
    audio_s: float
    shared: bool = False


class Quotas(Protocol):
    """The per-client buckets admission charges, this node's or the fleet's."""

    async def acquire(self, client: str, audio_s: float, requests: int = 1) -> Grant:
        """Charge ``requests`` requests (one per stream; none for more audio of a stream that
        has its request) and ``audio_s`` seconds to ``client``; raises :class:`RateLimited`
        (charging nothing) when either bucket is short."""
        ...

    def settle(self, grant: Grant, used_audio_s: float) -> None:
        """Give back the audio a granted request did not use."""
        ...

    def refund(self, grant: Grant) -> None:
        """Give back a request that never started: its request token and all its audio."""
        ...


class RateLimiter:
    def __init__(
        self,
        requests_per_minute: float,
        audio_seconds_per_minute: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.requests_per_minute = requests_per_minute
        self.audio_seconds_per_minute = audio_seconds_per_minute
        self.clock = clock
        self._buckets: OrderedDict[str, tuple[TokenBucket | None, TokenBucket | None]] = (
            OrderedDict()
        )

    async def acquire(self, client: str, audio_s: float, requests: int = 1) -> Grant:
        """:meth:`admit` (this node's buckets answer at once)."""
        return self.admit(client, audio_s, requests)

    def admit(self, client: str, audio_s: float, request_count: int = 1) -> Grant:
        """Charge ``request_count`` requests and ``audio_s`` seconds to ``client``. Raises
        :class:`RateLimited` (and charges nothing) when either bucket is short."""
        now = self.clock()
        requests, audio = self._client(client, now)
        waits = []
        if requests is not None and request_count:
            waits.append(("request", requests.wait_s(request_count, now)))
        if audio is not None:
            waits.append(("audio", audio.wait_s(audio_s, now)))
        reason, wait = max(waits, key=lambda w: w[1], default=("", 0.0))
        if wait > 0:
            raise RateLimited(reason, wait)
        if requests is not None and request_count:
            requests.take(request_count)
        if audio is not None:
            audio.take(audio_s)
        return Grant(client, audio_s)

    def settle(self, grant: Grant, used_audio_s: float) -> None:
        """Give back the audio a granted request did not use."""
        _, audio = self._buckets.get(grant.client, (None, None))
        if audio is not None and used_audio_s < grant.audio_s:
            audio.give_back(grant.audio_s - used_audio_s)

    def refund(self, grant: Grant) -> None:
        """The request never started (refused for capacity, or its client left while it
        waited): give back its request token and all its audio."""
        requests, _ = self._buckets.get(grant.client, (None, None))
        if requests is not None:
            requests.give_back(1)
        self.settle(grant, 0.0)

    def _client(self, client: str, now: float) -> tuple[TokenBucket | None, TokenBucket | None]:
        if client not in self._buckets:
            self._buckets[client] = (
                TokenBucket(self.requests_per_minute, now) if self.requests_per_minute else None,
                TokenBucket(self.audio_seconds_per_minute, now)
                if self.audio_seconds_per_minute
                else None,
            )
            while len(self._buckets) > MAX_CLIENTS:
                self._buckets.popitem(last=False)
        self._buckets.move_to_end(client)
        return self._buckets[client]
