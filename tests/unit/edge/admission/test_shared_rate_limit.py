"""The fleet's rate limits in a real Redis: two nodes charge the same buckets, unused audio goes
back, and while Redis is away the configured failure mode holds, counted, until it answers."""

from __future__ import annotations

import asyncio

import pytest
from prometheus_client import generate_latest

from cadenza.config import LimitsConfig, load_config
from cadenza.config.loading import ConfigError
from cadenza.edge.admission.rate_limit import QuotasUnavailable, RateLimited, RateLimiter
from cadenza.edge.admission.shared_rate_limit import SharedRateLimiter, quotas_for
from cadenza.edge.server.metrics import Metrics
from tests.support.redis_process import RedisServer, running_redis


def node(url: str, per_minute: float = 0, audio_per_minute: float = 0, failure="open"):
    metrics = Metrics()
    limiter = SharedRateLimiter(
        url, RateLimiter(per_minute, audio_per_minute), metrics, failure=failure
    )
    return limiter, metrics


def test_two_nodes_share_one_allowance(redis_server: RedisServer) -> None:
    async def scenario() -> tuple[int, list[RateLimited]]:
        a, _ = node(redis_server.url, per_minute=12)
        b, _ = node(redis_server.url, per_minute=12)
        granted, refused = 0, []
        for i in range(16):
            try:
                await (a if i % 2 else b).acquire("ip:10.0.0.1", 1.0)
                granted += 1
            except RateLimited as exc:
                refused.append(exc)
        await b.acquire("ip:10.0.0.2", 1.0)  # another client: its own buckets
        await a.close()
        await b.close()
        return granted, refused

    granted, refused = asyncio.run(scenario())
    assert granted == 12 and len(refused) == 4
    assert all(r.reason == "request" and 0 < r.retry_after_s <= 5.0 for r in refused)


def test_unused_audio_goes_back_and_a_refused_stream_is_refunded(
    redis_server: RedisServer,
) -> None:
    async def scenario() -> None:
        a, _ = node(redis_server.url, audio_per_minute=60)
        b, _ = node(redis_server.url, audio_per_minute=60)
        grant = await a.acquire("key:k", 50)
        with pytest.raises(RateLimited) as short:
            await b.acquire("key:k", 20)
        assert short.value.reason == "audio"
        a.settle(grant, 10)  # used 10 of 50: 40 back
        await asyncio.sleep(0.1)
        second = await b.acquire("key:k", 45)
        b.refund(second)
        await asyncio.sleep(0.1)
        await a.acquire("key:k", 45)
        await a.close()
        await b.close()

    asyncio.run(scenario())


def test_more_audio_of_a_stream_charges_the_shared_audio_but_no_request(
    redis_server: RedisServer,
) -> None:
    async def scenario() -> None:
        a, _ = node(redis_server.url, per_minute=1, audio_per_minute=60)
        await a.acquire("key:more", 10)
        await a.acquire("key:more", 30, requests=0)
        with pytest.raises(RateLimited) as short:
            await a.acquire("key:more", 30, requests=0)
        assert short.value.reason == "audio"
        with pytest.raises(RateLimited) as second:
            await a.acquire("key:more", 1)
        assert second.value.reason == "request"
        await a.close()

    asyncio.run(scenario())


def test_redis_away_open_admits_locally_closed_refuses_and_both_recover(tmp_path) -> None:
    async def scenario(redis: RedisServer) -> None:
        opened, open_metrics = node(redis.url, per_minute=2, failure="open")
        closed, closed_metrics = node(redis.url, per_minute=2, failure="closed")
        assert (await opened.acquire("c", 1)).shared
        redis.process.stop()
        local = await opened.acquire("c", 1)  # this node's own bucket (2 a minute)
        assert not local.shared and not opened.sharing
        with pytest.raises(QuotasUnavailable) as refused:
            await closed.acquire("c", 1)
        assert refused.value.retry_after_s > 0
        for metrics in (open_metrics, closed_metrics):
            text = generate_latest(metrics.registry).decode()
            assert "cadenza_quota_shared 0.0" in text
            assert "cadenza_quota_redis_failures_total 1.0" in text
        opened.settle(local, 0)  # back to the bucket it came from
        with running_redis(tmp_path, port=redis.port):
            for limiter in (opened, closed):
                limiter.outage.retry_at = 0.0  # no need to wait out the retry interval in a test
            assert (await opened.acquire("c", 1)).shared and opened.sharing
            assert (await closed.acquire("c", 1)).shared
            assert "cadenza_quota_shared 1.0" in generate_latest(open_metrics.registry).decode()
            await opened.close()
            await closed.close()

    with running_redis(tmp_path) as redis:
        asyncio.run(scenario(redis))


def test_without_a_url_the_node_keeps_its_own_buckets() -> None:
    assert isinstance(quotas_for(LimitsConfig(requests_per_minute=5), Metrics()), RateLimiter)


@pytest.mark.parametrize(
    "garbage",
    [
        "localhost:6379",
        "http://127.0.0.1:6379",
        "redis://",
        "redis://127.0.0.1:notaport/0",
        "redis://127.0.0.1:99999/0",
        "redis://127.0.0.1:6379/zero",
    ],
)
def test_a_bad_redis_url_is_named(garbage: str) -> None:
    with pytest.raises(ConfigError, match=r"limits\.redis_url"):
        load_config(overrides={"limits": {"redis_url": garbage}})
