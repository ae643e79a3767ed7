"""The fleet's open streams per credential, in Redis (``limits.redis_url``).

The count is that of :mod:`~cadenza.edge.admission.client_streams`, kept in Redis so that a
client spreading its streams over the fleet gets ``limits.max_streams_per_client`` in all, not
per node: a sorted set per holder, ``cadenza:open_streams:{HOLDER}``, whose members are the
holder's open streams (their ids) scored by the time, on Redis's clock in ms, at which each
stops counting::

    cadenza:open_streams:{key:abc}     member (stream id)    score (counts until, ms)
                                       9f2c...               1767225630500
                                       41ab...               1767225641200

Admitting a stream is one atomic script: drop the members whose time has passed, refuse when as
many as the limit remain, else add the stream (a stream already there, resumed from a lost
node, is renewed rather than counted again). Its end removes it, in a round trip the stream
does not wait for. While streams live, their node renews their entries every third of
:data:`STREAM_TTL_S`, all of them in one pipelined round trip; a node that dies stops renewing,
so its streams stop counting at most :data:`STREAM_TTL_S` later: no holder stays locked out by
a dead node. A renewal adds back an entry that is missing, so a stream admitted by the node's
own count while Redis was away joins the fleet's count at the first renewal that reaches it,
and a resumed stream keeps its entry even when the node that lost it removes it late.

While Redis cannot be reached (refused, timed out, an error), ``limits.redis_failure`` decides,
as for the rate limits (:mod:`~cadenza.edge.admission.shared_rate_limit`): ``"open"`` admits by
this node's own count, ``"closed"`` refuses new streams with 503 ``quota_unavailable``. The
outage is logged once and counted (``cadenza_quota_redis_failures_total``), and Redis is tried
again after :data:`~cadenza.edge.admission.redis_outage.RETRY_AFTER_S`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Literal

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from cadenza.config import LimitsConfig
from cadenza.edge.admission.client_streams import (
    ClientStreams,
    NodeStreams,
    StreamSlot,
    TooManyStreams,
)
from cadenza.edge.admission.rate_limit import QuotasUnavailable
from cadenza.edge.admission.redis_outage import RETRY_AFTER_S, RedisOutage
from cadenza.edge.admission.shared_rate_limit import TIMEOUT_S
from cadenza.edge.server.metrics import Metrics

log = logging.getLogger(__name__)

STREAM_TTL_S = 30.0  # how long a stream's entry counts without its node renewing it

# KEYS: the holder's set. ARGV: the limit, the entry's time to live (ms), the stream id.
# Returns {1} when the stream counts now (it may already have: a resume), else {0, open}.
_ADMIT = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[2])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if not redis.call('ZSCORE', KEYS[1], ARGV[3]) then
  local open = redis.call('ZCARD', KEYS[1])
  if open >= tonumber(ARGV[1]) then return {0, open} end
end
redis.call('ZADD', KEYS[1], now + ttl, ARGV[3])
if redis.call('PTTL', KEYS[1]) < ttl then redis.call('PEXPIRE', KEYS[1], ttl) end
return {1}
"""

# KEYS: the holder's set. ARGV: the time to live (ms), then the ids of its streams that live
# here. Each counts for another time to live from now (added again if it had gone).
_RENEW = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
for i = 2, #ARGV do redis.call('ZADD', KEYS[1], now + ttl, ARGV[i]) end
if redis.call('PTTL', KEYS[1]) < ttl then redis.call('PEXPIRE', KEYS[1], ttl) end
return 1
"""


def holder_key(holder: str) -> str:
    """The Redis key of ``holder``'s open streams."""
    return f"cadenza:open_streams:{{{holder}}}"


class FleetStreams:
    """The fleet's count in the Redis at ``url`` (see the module docstring), this node's
    (``local``) while Redis cannot be reached and ``failure`` is ``"open"``."""

    def __init__(
        self,
        url: str,
        local: NodeStreams,
        metrics: Metrics,
        failure: Literal["open", "closed"] = "open",
        ttl_s: float = STREAM_TTL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.local = local
        self.metrics = metrics
        self.failure = failure
        self.ttl_s = ttl_s
        self.outage = RedisOutage(
            "streams per client",
            url,
            "counting this node's own streams"
            if failure == "open"
            else "refusing new streams (limits.redis_failure = closed)",
            metrics,
            clock,
        )
        self.redis = aioredis.Redis.from_url(
            url, socket_timeout=TIMEOUT_S, socket_connect_timeout=TIMEOUT_S
        )
        self._admit = self.redis.register_script(_ADMIT)
        self._renew = self.redis.register_script(_RENEW)
        self._renewer: asyncio.Task[None] | None = None
        self._pending: set[asyncio.Task[None]] = set()

    @property
    def sharing(self) -> bool:
        """Whether the last round trip reached Redis."""
        return self.outage.sharing

    async def acquire(self, holder: str, stream_id: str) -> StreamSlot:
        """Count the stream in the fleet's set (see the module docstring for the failure
        modes)."""
        if self.outage.may_try():
            try:
                answer = await asyncio.wait_for(
                    self._admit(
                        keys=[holder_key(holder)],
                        args=[self.local.limit, round(self.ttl_s * 1000), stream_id],
                    ),
                    TIMEOUT_S * 2,
                )
            except (RedisError, OSError, TimeoutError) as exc:
                self.outage.failed(exc)
            else:
                self.outage.reached()
                if int(answer[0]) != 1:
                    raise TooManyStreams(self.local.limit)
                slot = self.local.admit(holder, stream_id, check=False)
                slot.shared = True
                self._keep_renewing()
                return slot
        if self.failure == "closed":
            raise QuotasUnavailable(
                "the fleet's stream counts cannot be read (Redis unreachable); retry shortly",
                RETRY_AFTER_S,
            )
        slot = self.local.admit(holder, stream_id)
        self._keep_renewing()  # it joins the fleet's count once Redis answers
        return slot

    def release(self, slot: StreamSlot) -> bool:
        """Stop counting the stream here and, without waiting, in Redis."""
        if not self.local.release(slot):
            return False
        self._send_remove(slot)
        return True

    async def aclose(self) -> None:
        """Stop renewing, wait briefly for the removals in flight, close the connections."""
        if self._renewer is not None:
            self._renewer.cancel()
        if self._pending:
            await asyncio.wait(self._pending, timeout=TIMEOUT_S * 2)
        await self.redis.aclose()

    async def renew(self) -> None:
        """Renew the entries of every stream open here, in one round trip (a no-op while Redis
        is being left alone after a failure)."""
        slots = self.local.open_slots()
        if not slots or not self.outage.may_try():
            return
        by_holder: dict[str, list[str]] = {}
        for slot in slots:
            by_holder.setdefault(slot.holder, []).append(slot.stream_id)
        ttl_ms = round(self.ttl_s * 1000)
        pipe = self.redis.pipeline(transaction=False)
        for holder, stream_ids in by_holder.items():
            await self._renew(keys=[holder_key(holder)], args=[ttl_ms, *stream_ids], client=pipe)
        try:
            await asyncio.wait_for(pipe.execute(), TIMEOUT_S * 2)
        except (RedisError, OSError, TimeoutError) as exc:
            self.outage.failed(exc)
            return
        self.outage.reached()
        for slot in slots:
            slot.shared = True
            if slot.released:  # it ended while the renewal was on its way: remove it again
                self._send_remove(slot)

    def _keep_renewing(self) -> None:
        if self._renewer is None or self._renewer.done():
            self._renewer = asyncio.get_running_loop().create_task(self._renew_while_open())

    async def _renew_while_open(self) -> None:
        while self.local.open_slots():
            await asyncio.sleep(self.ttl_s / 3)
            await self.renew()

    def _send_remove(self, slot: StreamSlot) -> None:
        if not self.outage.may_try():
            return  # Redis is away: the entry, no longer renewed, expires

        async def remove() -> None:
            try:
                await asyncio.wait_for(
                    self.redis.zrem(holder_key(slot.holder), slot.stream_id), TIMEOUT_S * 2
                )
            except (RedisError, OSError, TimeoutError) as exc:
                self.outage.failed(exc)  # the entry, no longer renewed, expires

        task = asyncio.get_running_loop().create_task(remove())
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)


def client_streams_for(limits: LimitsConfig, metrics: Metrics) -> ClientStreams:
    """The count ``limits`` configure: the fleet's with ``limits.redis_url`` (and a limit),
    else this node's."""
    local = NodeStreams(limits.max_streams_per_client)
    if limits.redis_url is None or limits.max_streams_per_client == 0:
        return local
    return FleetStreams(limits.redis_url, local, metrics, limits.redis_failure)
