"""An outage of the fleet's Redis: logged once when it starts and once when it ends, every
failure counted, Redis left alone for a moment after each, the URL's password never shown."""

from __future__ import annotations

import logging

from cadenza.edge.admission.redis_outage import RETRY_AFTER_S, RedisOutage
from cadenza.edge.server.metrics import Metrics


def test_an_outage_is_told_once_each_way_and_retried_after_a_pause(caplog) -> None:
    now = [100.0]
    changes: list[bool] = []
    metrics = Metrics()
    outage = RedisOutage(
        "rate limits", "redis://:hunter2@redis:6379/0", "admitting by this node's own buckets",
        metrics, clock=lambda: now[0], on_change=changes.append,
    )  # fmt: skip
    caplog.set_level(logging.INFO, logger="cadenza")
    assert outage.sharing and outage.may_try()
    outage.failed(ConnectionRefusedError())
    outage.failed(TimeoutError())
    assert not outage.sharing and not outage.may_try() and changes == [False]
    now[0] += RETRY_AFTER_S
    assert outage.may_try()
    outage.reached()
    outage.reached()
    assert outage.sharing and changes == [False, True]
    lines = [r.getMessage() for r in caplog.records if r.name.endswith("redis_outage")]
    assert len(lines) == 2 and "unreachable" in lines[0] and "answers again" in lines[1]
    assert all("hunter2" not in line and ":***@redis" in line for line in lines)
    assert metrics.quota_redis_failures._value.get() == 2
