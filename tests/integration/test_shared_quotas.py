"""Quotas shared in Redis across two real nodes: a client spreading its requests over both gets
the fleet's allowance once, not once per node; with Redis stopped the configured failure mode
holds and is counted; with Redis back the nodes share again by themselves."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import httpx

from tests.integration.server import RunningServer
from tests.support.redis_process import running_redis

DETERMINISTIC = {"CADENZA_CALIBRATION__MODE": "off", "CADENZA_ADMISSION__SLACK_CLOSE_MS": "-1e9"}
BODY = {"model": "cadenza-tiny", "input": "hi", "response_format": "pcm", "max_duration_s": 0.3}


def speak(url: str) -> httpx.Response:
    return httpx.post(f"{url}/v1/audio/speech", json=BODY, timeout=60)


def metric(server: RunningServer, name: str) -> float:
    return server.metric(name + "{") + server.metric(name + " ")


def test_two_nodes_share_one_allowance_and_survive_redis(tmp_path) -> None:
    with running_redis(tmp_path) as redis:
        _share_and_survive(tmp_path, redis)


def _share_and_survive(tmp_path, redis) -> None:
    env = {
        **DETERMINISTIC,
        "CADENZA_LIMITS__REQUESTS_PER_MINUTE": "12",
        "CADENZA_LIMITS__REDIS_URL": redis.url,
    }
    nodes = [
        RunningServer(tmp_path / f"node-{name}.log", env, args=("--node-id", name))
        for name in ("a", "b")
    ]
    try:
        for node in nodes:
            node.wait_ready()
        started = time.monotonic()
        urls = [nodes[i % 2].url for i in range(15)]
        with ThreadPoolExecutor(max_workers=15) as pool:
            responses = list(pool.map(speak, urls))
        elapsed = time.monotonic() - started
        served = [r for r in responses if r.status_code == 200]
        limited = [r for r in responses if r.status_code == 429]
        refills = int(elapsed * 12 / 60)  # a token comes back every 5 s
        assert 12 <= len(served) <= 12 + refills and len(served) + len(limited) == 15
        assert {r.headers["x-cadenza-node"] for r in served} == {"a", "b"}
        assert {r.headers["x-cadenza-node"] for r in limited} <= {"a", "b"} and limited
        assert all(int(r.headers["retry-after"]) >= 1 for r in limited)
        assert all(r.json()["error"]["code"] == "rate_limited" for r in limited)

        redis.process.stop()  # limits.redis_failure = "open": each node's own buckets
        response = speak(nodes[0].url)
        assert response.status_code == 200
        assert metric(nodes[0], "cadenza_quota_redis_failures_total") >= 1
        assert metric(nodes[0], "cadenza_quota_shared") == 0

        with running_redis(tmp_path, port=redis.port):
            deadline = time.monotonic() + 10
            while metric(nodes[0], "cadenza_quota_shared") != 1:
                assert time.monotonic() < deadline, "sharing did not resume"
                speak(nodes[0].url)
                time.sleep(0.3)
    finally:
        for node in nodes:
            node.stop()


def test_closed_refuses_while_redis_is_away(tmp_path) -> None:
    with running_redis(tmp_path) as redis:
        _closed(tmp_path, redis)


def _closed(tmp_path, redis) -> None:
    env = {
        **DETERMINISTIC,
        "CADENZA_LIMITS__REQUESTS_PER_MINUTE": "100",
        "CADENZA_LIMITS__REDIS_URL": redis.url,
        "CADENZA_LIMITS__REDIS_FAILURE": "closed",
    }
    node = RunningServer(tmp_path / "node.log", env)
    try:
        node.wait_ready()
        assert speak(node.url).status_code == 200
        redis.process.stop()
        refused = speak(node.url)
        assert refused.status_code == 503 and int(refused.headers["retry-after"]) >= 1
        assert refused.json()["error"]["code"] == "quota_unavailable"
    finally:
        node.stop()
