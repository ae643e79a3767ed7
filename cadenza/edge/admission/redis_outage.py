"""Whether the fleet's Redis answers, for the admission state kept there (rate limits,
streams per client), each of which falls back while it does not.

After a failed round trip (refused, timed out, an error) its user stops asking Redis for
:data:`RETRY_AFTER_S` and falls back as ``limits.redis_failure`` says (this node's own state,
or refusals); the outage is logged once when it starts and once when Redis answers again, and
every failure is counted (``cadenza_quota_redis_failures_total``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from cadenza.config.limits import redacted_url
from cadenza.edge.server.metrics import Metrics

log = logging.getLogger(__name__)

RETRY_AFTER_S = 1.0  # after a failure, the fallback for this long


class RedisOutage:
    """The state of one user's Redis: ``purpose`` names the user in the log (``rate
    limits``), ``fallback`` what it does meanwhile; ``on_change(sharing)`` is called when an
    outage starts (``False``) and ends (``True``)."""

    def __init__(
        self,
        purpose: str,
        url: str,
        fallback: str,
        metrics: Metrics,
        clock: Callable[[], float] = time.monotonic,
        on_change: Callable[[bool], None] | None = None,
    ) -> None:
        self.purpose = purpose
        self.url = redacted_url(url)  # as the log names it, its password (if any) hidden
        self.fallback = fallback
        self.metrics = metrics
        self.clock = clock
        self.on_change = on_change
        self.retry_at = 0.0
        self._down_since: float | None = None

    @property
    def sharing(self) -> bool:
        """Whether the last round trip reached Redis."""
        return self._down_since is None

    def may_try(self) -> bool:
        """Whether Redis is to be asked now (not within :data:`RETRY_AFTER_S` of a failure)."""
        return self.clock() >= self.retry_at

    def failed(self, exc: BaseException) -> None:
        """A round trip failed with ``exc``."""
        self.metrics.quota_redis_failures.inc()
        self.retry_at = self.clock() + RETRY_AFTER_S
        if self._down_since is None:
            self._down_since = self.clock()
            log.warning(
                "%s: Redis at %s unreachable (%r); %s", self.purpose, self.url, exc, self.fallback
            )
            if self.on_change is not None:
                self.on_change(False)

    def reached(self) -> None:
        """A round trip reached Redis."""
        if self._down_since is not None:
            log.info(
                "%s: Redis at %s answers again after %.1f s; shared again",
                self.purpose,
                self.url,
                self.clock() - self._down_since,
            )
            self._down_since = None
            if self.on_change is not None:
                self.on_change(True)
