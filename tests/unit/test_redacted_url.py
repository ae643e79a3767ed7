"""A Redis URL's password never reaches a log line or an error message: the URL is shown with
``***`` in its place (:func:`cadenza.config.limits.redacted_url`), by the configuration's
errors and by the fleet's rate limits, which still reach a Redis that wants the password."""

from __future__ import annotations

import asyncio
import logging

import pytest

from cadenza.config import load_config
from cadenza.config.limits import redacted_url
from cadenza.config.section import ConfigError
from cadenza.edge.admission.rate_limit import RateLimiter
from cadenza.edge.admission.shared_rate_limit import SharedRateLimiter
from cadenza.edge.server.metrics import Metrics
from tests.support.ports import free_port
from tests.support.redis_process import running_redis

PASSWORD = "hunter2-correct-horse"


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        (f"redis://:{PASSWORD}@redis.internal:6379/0", "redis://:***@redis.internal:6379/0"),
        (f"rediss://cadenza:{PASSWORD}@redis:6380/1", "rediss://cadenza:***@redis:6380/1"),
        (f"redis://{PASSWORD}@redis/0", "redis://***@redis/0"),  # taken for a password by some
        (f"redis://redis/0?password={PASSWORD}&ssl=1", "redis://redis/0?password=***&ssl=1"),
        (f"unix:///run/redis.sock?password={PASSWORD}", "unix:///run/redis.sock?password=***"),
        ("redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379/0"),  # nothing to hide
        ("redis://[::1]:6379/0", "redis://[::1]:6379/0"),
    ],
)
def test_a_url_is_shown_without_its_password(url: str, shown: str) -> None:
    assert redacted_url(url) == shown


def test_a_bad_url_is_named_without_its_password() -> None:
    with pytest.raises(ConfigError) as bad:
        load_config(overrides={"limits": {"redis_url": f"http://:{PASSWORD}@redis/0"}})
    assert "http://:***@redis/0" in str(bad.value) and PASSWORD not in str(bad.value)


def test_the_rate_limits_log_a_redis_away_without_its_password(caplog) -> None:
    url = f"redis://:{PASSWORD}@127.0.0.1:{free_port()}/0"  # nobody listens there

    async def scenario() -> None:
        limiter = SharedRateLimiter(url, RateLimiter(5, 0), Metrics())
        await limiter.acquire("key:alice", 1)
        await limiter.close()

    with caplog.at_level(logging.WARNING):
        asyncio.run(scenario())
    lines = [record.getMessage() for record in caplog.records]
    assert any("redis://:***@127.0.0.1" in line for line in lines), lines
    assert not any(PASSWORD in line for line in lines)


def test_a_redis_that_wants_a_password_is_reached_with_the_urls(tmp_path) -> None:
    async def scenario(url: str) -> bool:
        limiter = SharedRateLimiter(url, RateLimiter(5, 0), Metrics())
        grant = await limiter.acquire("key:alice", 1)
        await limiter.close()
        return grant.shared

    with running_redis(tmp_path, password=PASSWORD) as redis:
        assert asyncio.run(scenario(redis.url))
