"""The fleet's open streams per holder in a real Redis: two nodes see one count, a stream
resumed on another node counts once, a dead node's streams stop counting after the entries'
time to live while a live node's are renewed past it, and while Redis is away the configured
failure mode holds until it answers again."""

from __future__ import annotations

import asyncio

import pytest
from prometheus_client import generate_latest

from cadenza.config import LimitsConfig
from cadenza.edge.admission.client_streams import NodeStreams, TooManyStreams
from cadenza.edge.admission.rate_limit import QuotasUnavailable
from cadenza.edge.admission.shared_client_streams import (
    FleetStreams,
    client_streams_for,
    holder_key,
)
from cadenza.edge.server.metrics import Metrics
from tests.support.redis_process import RedisServer, running_redis


def node(url: str, limit: int, failure="open", ttl_s: float = 30.0) -> FleetStreams:
    return FleetStreams(url, NodeStreams(limit), Metrics(), failure=failure, ttl_s=ttl_s)


async def members(streams: FleetStreams, holder: str) -> set[str]:
    entries = await streams.redis.zrange(holder_key(holder), 0, -1)
    return {entry.decode() for entry in entries if isinstance(entry, bytes)}


def test_two_nodes_share_one_count(redis_server: RedisServer) -> None:
    async def scenario() -> None:
        a, b = node(redis_server.url, 2), node(redis_server.url, 2)
        first = await a.acquire("key:k", "s1")
        await b.acquire("key:k", "s2")
        with pytest.raises(TooManyStreams):
            await a.acquire("key:k", "s3")
        with pytest.raises(TooManyStreams):
            await b.acquire("key:k", "s3")
        await b.acquire("key:other", "s3")  # another holder: its own count
        assert first.shared and a.local.count("key:k") == 1
        assert a.release(first) and not a.release(first)
        await asyncio.sleep(0.1)  # the removal is sent, not awaited
        assert await members(a, "key:k") == {"s2"}
        await b.acquire("key:k", "s4")
        for streams in (a, b):
            await streams.aclose()

    asyncio.run(scenario())


def test_a_resumed_stream_counts_once(redis_server: RedisServer) -> None:
    """The node that lost a stream still has its entry; the node that resumes it counts the
    same id, at the limit, without a second place."""

    async def scenario() -> None:
        lost, resumer = node(redis_server.url, 1), node(redis_server.url, 1)
        await lost.acquire("key:k", "stream-1")
        resumed = await resumer.acquire("key:k", "stream-1")
        assert await members(resumer, "key:k") == {"stream-1"}
        await lost.aclose()  # it goes without removing its entry
        resumer.release(resumed)
        await asyncio.sleep(0.1)
        assert await members(resumer, "key:k") == set()
        await resumer.aclose()

    asyncio.run(scenario())


def test_a_dead_nodes_streams_expire_and_a_live_nodes_are_renewed(
    redis_server: RedisServer,
) -> None:
    async def scenario() -> None:
        ttl_s = 0.6
        dead, live = node(redis_server.url, 1, ttl_s=ttl_s), node(redis_server.url, 1, ttl_s=ttl_s)
        await dead.acquire("key:dead", "d1")
        kept = await live.acquire("key:live", "l1")
        await dead.aclose()  # stops renewing, removes nothing: a node that died
        other = node(redis_server.url, 1, ttl_s=ttl_s)
        with pytest.raises(TooManyStreams):
            await other.acquire("key:dead", "d2")
        await asyncio.sleep(ttl_s * 2.5)  # several renewals of the live node's stream
        await other.acquire("key:dead", "d2")  # the dead node's stream stopped counting
        with pytest.raises(TooManyStreams):
            await other.acquire("key:live", "l2")  # the live one's still counts
        live.release(kept)
        await asyncio.sleep(0.1)
        await other.acquire("key:live", "l2")
        assert await members(other, "key:dead") == {"d2"}
        for streams in (live, other):
            await streams.aclose()

    asyncio.run(scenario())


def test_a_release_during_a_renewal_is_not_undone(redis_server: RedisServer) -> None:
    async def scenario() -> None:
        streams = node(redis_server.url, 1)
        slot = await streams.acquire("key:k", "s1")
        renewal = asyncio.ensure_future(streams.renew())
        await asyncio.sleep(0)  # the renewal has taken its list of streams
        streams.release(slot)
        await renewal
        await asyncio.sleep(0.1)
        assert await members(streams, "key:k") == set()
        await streams.aclose()

    asyncio.run(scenario())


def test_redis_away_open_counts_locally_closed_refuses_and_both_recover(tmp_path) -> None:
    async def scenario(redis: RedisServer) -> None:
        opened = node(redis.url, 1, failure="open")
        closed = node(redis.url, 1, failure="closed")
        redis.process.stop()
        local = await opened.acquire("key:k", "s1")  # this node's own count
        assert not local.shared and not opened.sharing
        with pytest.raises(TooManyStreams):
            await opened.acquire("key:k", "s2")
        with pytest.raises(QuotasUnavailable) as refused:
            await closed.acquire("key:k", "s3")
        assert refused.value.retry_after_s > 0
        failures = generate_latest(closed.metrics.registry).decode()
        assert "cadenza_quota_redis_failures_total 1.0" in failures
        with running_redis(tmp_path, port=redis.port):
            for streams in (opened, closed):
                streams.outage.retry_at = 0.0  # no need to wait out the retry interval in a test
            await opened.renew()  # the stream admitted while Redis was away joins the count
            assert local.shared and opened.sharing
            with pytest.raises(TooManyStreams):
                await closed.acquire("key:k", "s3")
            opened.release(local)
            await asyncio.sleep(0.1)
            assert (await closed.acquire("key:k", "s3")).shared
            await opened.aclose()
            await closed.aclose()

    with running_redis(tmp_path) as redis:
        asyncio.run(scenario(redis))


def test_without_a_url_or_a_limit_the_node_counts_its_own() -> None:
    url = "redis://127.0.0.1:6379/0"
    assert isinstance(
        client_streams_for(LimitsConfig(max_streams_per_client=2), Metrics()), NodeStreams
    )
    unlimited = LimitsConfig(redis_url=url, max_streams_per_client=0)
    assert isinstance(client_streams_for(unlimited, Metrics()), NodeStreams)
    shared = client_streams_for(LimitsConfig(redis_url=url, max_streams_per_client=2), Metrics())
    assert isinstance(shared, FleetStreams)
    asyncio.run(shared.aclose())
