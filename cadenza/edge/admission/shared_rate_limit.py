"""The fleet's per-client buckets, in Redis (``cadenza serve --redis-url redis://HOST:PORT/DB``).

The buckets are those of :mod:`~cadenza.edge.admission.rate_limit` (one minute's allowance,
refilled continuously), kept in Redis so that every node behind the front door charges the
same ones: a client spreading its requests over the fleet gets the fleet's allowance, not one
per node. An admission is one atomic round trip: a Lua script refills both of the client's
buckets by Redis's own clock (nodes' clocks need not agree), checks them and takes the
request's cost, or says how long until it would fit. What a stream did not use goes back when
it ends (a second script, sent without waiting for it). A client's buckets expire once they
would be full again, so idle clients cost Redis nothing. Keys: ``cadenza:quota:{CLIENT}:r``
and ``:a`` (the braces keep a client's keys in one Redis Cluster slot).

While Redis cannot be reached (refused, timed out, an error), ``limits.redis_failure`` decides:
``"open"`` (the default) admits by this node's own buckets, ``"closed"`` refuses new streams
with 503 ``quota_unavailable`` and ``Retry-After``. The outage is logged once, counted
(``cadenza_quota_redis_failures_total``; ``cadenza_quota_shared`` is 0 meanwhile), Redis is
tried again after :data:`~cadenza.edge.admission.redis_outage.RETRY_AFTER_S`, and sharing
resumes by itself when it answers (:mod:`~cadenza.edge.admission.redis_outage`).
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
from cadenza.edge.admission.rate_limit import (
    Grant,
    Quotas,
    QuotasUnavailable,
    RateLimited,
    RateLimiter,
)
from cadenza.edge.admission.redis_outage import RETRY_AFTER_S, RedisOutage
from cadenza.edge.server.metrics import Metrics

log = logging.getLogger(__name__)

TIMEOUT_S = 0.25  # one admission's round trip (and a connection's set-up) at most

# KEYS: the request bucket, the audio bucket. ARGV: requests per minute, audio seconds per
# minute (0: that bucket is off), the audio cost, the request cost (1 for a stream, 0 for more
# audio of one). Returns {1} when charged, else {0, reason,
# wait in seconds as a string (Lua numbers reach Redis as integers)}.
_ACQUIRE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
local function level(key, per_minute)
  local saved = redis.call('HMGET', key, 'tokens', 'at')
  local tokens = tonumber(saved[1]) or per_minute
  local at = tonumber(saved[2]) or now
  return math.min(per_minute, tokens + math.max(now - at, 0) * per_minute / 60)
end
local function wait_s(tokens, cost, per_minute)
  return math.max(0, (math.min(cost, per_minute) - tokens) * 60 / per_minute)
end
local costs = {tonumber(ARGV[4]), tonumber(ARGV[3])}
local rates = {tonumber(ARGV[1]), tonumber(ARGV[2])}
local reasons = {'request', 'audio'}
local levels = {}
local worst, reason = 0, ''
for i = 1, 2 do
  if rates[i] > 0 then
    levels[i] = level(KEYS[i], rates[i])
    local w = wait_s(levels[i], costs[i], rates[i])
    if w > worst then worst, reason = w, reasons[i] end
  end
end
if worst > 0 then return {0, reason, tostring(worst)} end
for i = 1, 2 do
  if rates[i] > 0 then
    local left = levels[i] - costs[i]
    redis.call('HSET', KEYS[i], 'tokens', tostring(left), 'at', tostring(now))
    redis.call('PEXPIRE', KEYS[i], math.ceil((rates[i] - left) * 60000 / rates[i]) + 1000)
  end
end
return {1}
"""

# KEYS: the request bucket, the audio bucket. ARGV: requests and audio seconds per minute, the
# request tokens and audio seconds to give back. A missing bucket is full: nothing to do.
_GIVE_BACK = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
for i = 1, 2 do
  local per_minute, amount = tonumber(ARGV[i]), tonumber(ARGV[i + 2])
  if per_minute > 0 and amount > 0 and redis.call('EXISTS', KEYS[i]) == 1 then
    local saved = redis.call('HMGET', KEYS[i], 'tokens', 'at')
    local tokens = tonumber(saved[1]) + math.max(now - tonumber(saved[2]), 0) * per_minute / 60
    tokens = math.min(per_minute, tokens + amount)
    redis.call('HSET', KEYS[i], 'tokens', tostring(tokens), 'at', tostring(now))
    redis.call('PEXPIRE', KEYS[i], math.ceil((per_minute - tokens) * 60000 / per_minute) + 1000)
  end
end
return 1
"""


def bucket_keys(client: str) -> list[str]:
    """The Redis keys of ``client``'s request and audio buckets."""
    return [f"cadenza:quota:{{{client}}}:r", f"cadenza:quota:{{{client}}}:a"]


class SharedRateLimiter:
    """The fleet's buckets in the Redis at ``url``, this node's (``local``) while it cannot be
    reached and ``failure`` is ``"open"``."""

    def __init__(
        self,
        url: str,
        local: RateLimiter,
        metrics: Metrics,
        failure: Literal["open", "closed"] = "open",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.local = local
        self.metrics = metrics
        self.failure = failure
        self.outage = RedisOutage(
            "rate limits",
            url,
            "admitting by this node's own buckets"
            if failure == "open"
            else "refusing new streams (limits.redis_failure = closed)",
            metrics,
            clock,
            on_change=lambda sharing: metrics.quota_shared.set(int(sharing)),
        )
        self.redis = aioredis.Redis.from_url(
            url, socket_timeout=TIMEOUT_S, socket_connect_timeout=TIMEOUT_S
        )
        self._acquire = self.redis.register_script(_ACQUIRE)
        self._give_back = self.redis.register_script(_GIVE_BACK)
        self._pending: set[asyncio.Task[None]] = set()
        metrics.quota_shared.set(1)

    @property
    def sharing(self) -> bool:
        """Whether the last round trip reached Redis."""
        return self.outage.sharing

    async def acquire(self, client: str, audio_s: float, requests: int = 1) -> Grant:
        """Charge the fleet's buckets (see the module docstring for the failure modes)."""
        local = self.local
        if local.requests_per_minute == 0 and local.audio_seconds_per_minute == 0:
            return Grant(client, audio_s, shared=True)  # no limits: nothing to share
        if self.outage.may_try():
            try:
                answer = await asyncio.wait_for(
                    self._acquire(
                        keys=bucket_keys(client),
                        args=[
                            local.requests_per_minute,
                            local.audio_seconds_per_minute,
                            audio_s,
                            requests,
                        ],
                    ),
                    TIMEOUT_S * 2,
                )
            except (RedisError, OSError, TimeoutError) as exc:
                self.outage.failed(exc)
            else:
                self.outage.reached()
                if int(answer[0]) == 1:
                    return Grant(client, audio_s, shared=True)
                reason = answer[1].decode() if isinstance(answer[1], bytes) else str(answer[1])
                raise RateLimited(reason, float(answer[2]))
        if self.failure == "closed":
            raise QuotasUnavailable(
                "the fleet's rate limits cannot be read (Redis unreachable); retry shortly",
                RETRY_AFTER_S,
            )
        return local.admit(client, audio_s, requests)

    def settle(self, grant: Grant, used_audio_s: float) -> None:
        """Give back the audio ``grant`` did not use, to the buckets it was charged to."""
        if not grant.shared:
            self.local.settle(grant, used_audio_s)
        elif used_audio_s < grant.audio_s:
            self._send_give_back(grant.client, 0, grant.audio_s - used_audio_s)

    def refund(self, grant: Grant) -> None:
        """Give back a request that never started, to the buckets it was charged to."""
        if not grant.shared:
            self.local.refund(grant)
        else:
            self._send_give_back(grant.client, 1, grant.audio_s)

    async def close(self) -> None:
        """Wait briefly for the give-backs in flight, then close the connections."""
        if self._pending:
            await asyncio.wait(self._pending, timeout=TIMEOUT_S * 2)
        await self.redis.aclose()

    def _send_give_back(self, client: str, requests: int, audio_s: float) -> None:
        local = self.local
        if local.requests_per_minute == 0 and local.audio_seconds_per_minute == 0:
            return
        args = [local.requests_per_minute, local.audio_seconds_per_minute, requests, audio_s]

        async def give_back() -> None:
            try:
                await asyncio.wait_for(
                    self._give_back(keys=bucket_keys(client), args=args), TIMEOUT_S * 2
                )
            except (RedisError, OSError, TimeoutError) as exc:
                self.outage.failed(exc)  # lost: the client's bucket refills on its own

        task = asyncio.get_running_loop().create_task(give_back())
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)


def quotas_for(limits: LimitsConfig, metrics: Metrics) -> Quotas:
    """The buckets ``limits`` configure: the fleet's with ``limits.redis_url``, else this
    node's."""
    local = RateLimiter(limits.requests_per_minute, limits.audio_seconds_per_minute)
    if limits.redis_url is None:
        return local
    return SharedRateLimiter(limits.redis_url, local, metrics, limits.redis_failure)
