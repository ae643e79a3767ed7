"""Admission against the real server: ``/v1/capacity``, refusals with Retry-After on every
transport, and 3x overload with SDK clients keeping every admitted stream glitch-free.

The servers are capped at 4 concurrent streams (``engine.max_num_seqs``) so the overload stays
cheap on a 2-core CI machine. On the calibrated one the real-time limit from this machine's
measured step time applies below that, so its tests work from the ``max_streams`` it reports;
queueing and refusals are checked on an uncalibrated one whose 4 slots are exact.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
import warnings

import httpx
import pytest

from cadenza.client import StreamError, connect
from cadenza.contract.cpu_replicas import default_replicas
from cadenza.loadtest.level_runner import run_level
from cadenza.loadtest.workload import LoadOptions, TextLengths
from tests.integration.server import serving

MAX_SEQS = 4


ENV = {
    "CADENZA_ENGINE__MAX_NUM_SEQS": str(MAX_SEQS),
    "CADENZA_ADMISSION__REALTIME_MAX_WAIT_S": "2.0",
    "CADENZA_ADMISSION__STANDARD_MAX_WAIT_S": "60.0",
    "CADENZA_ADMISSION__MAX_QUEUE_LENGTH": "16",
    # The tests' utterances (30-60 characters, 2-4 s): the claim and the real-time limit
    # are quoted for streams like them, not for the default 10 s nominal stream.
    "CADENZA_ADMISSION__NOMINAL_STREAM_S": "4.0",
}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """Calibrated: real-time admission from this machine's measured step time."""
    log = tmp_path_factory.mktemp("capacity") / "server.log"
    with serving(log, ENV, calibrated=True) as running:
        yield running


@pytest.fixture(scope="module")
def slots(tmp_path_factory):
    """Uncalibrated: exactly ``MAX_SEQS`` slots, so queueing is deterministic."""
    with serving(tmp_path_factory.mktemp("slots") / "server.log", ENV) as running:
        yield running


def _capacity(server) -> dict:
    response = httpx.get(f"{server.url}/v1/capacity", timeout=10)
    assert response.status_code == 200
    return response.json()


def _wait_idle(server, timeout_s: float = 20.0) -> dict:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        capacity = _capacity(server)
        if (
            capacity["active"] == 0
            and capacity["queued"] == 0
            and capacity["kv_pages_free"] == capacity["kv_pages_total"]
            and server.metric("cadenza_engine_requests") == 0
        ):
            return capacity
        time.sleep(0.5)
    raise AssertionError(f"server did not return to idle: {_capacity(server)}")


def test_capacity_endpoint_reports_the_model(server) -> None:
    capacity = _capacity(server)
    for key in ("max_streams", "active", "queued", "kv_pages_total", "kv_pages_free"):
        assert isinstance(capacity[key], int), key
    assert isinstance(capacity["step_ms_p50"], float)
    assert capacity["rtf_headroom"] <= 1.0
    assert 1 <= capacity["max_streams"] <= MAX_SEQS  # an idle server always takes one
    assert capacity["calibration"]["model"]["decode_points"]
    bounds = capacity["bounds"]  # no headroom, factor or max_num_seqs: at least the limit
    assert bounds["realtime_short_context_streams"] >= bounds["realtime_streams"]
    assert bounds["realtime_streams"] >= capacity["limits"]["realtime"]
    assert bounds["throughput_streams"] == capacity["calibration"]["throughput_streams"]
    assert capacity["kv_pages_free"] == capacity["kv_pages_total"] > 0
    ready = httpx.get(f"{server.url}/readyz", timeout=10).json()
    precision = ready["models"]["cadenza-tiny"]["replicas"][0]["precision"]
    assert precision["logits"] == "float32" and precision["chosen_by"] in ("auto", "named")


def _promises_real_time(server) -> bool:
    """Whether the server promises at least one real-time stream now (its real-time limit).
    At 0 (this machine measured too slow for one nominal stream, e.g. calibrated while busy)
    it still admits one stream when idle, best effort, whose playback is not checked (its
    first audio still is): the test says so in a warning rather than failing on a promise
    never made."""
    limit = _capacity(server)["limits"]["realtime"]
    if limit < 1:
        message = "no real-time promise on this machine now: C100 unchecked"
        warnings.warn(message, stacklevel=2)
    return limit >= 1


def test_three_times_overload_keeps_admitted_streams_glitch_free(server) -> None:
    max_streams = _capacity(server)["max_streams"]
    promised = _promises_real_time(server)
    options = LoadOptions(
        url=server.url,
        duration_s=20.0,
        text_lengths=TextLengths(30, 60),
        client_buffer_ms=100.0,
    )

    async def overload() -> tuple[dict, httpx.Response, float]:
        level = asyncio.create_task(run_level(options, 3 * max_streams))
        await asyncio.sleep(6.0)  # realtime streams hold every slot; a standard one arrives
        async with httpx.AsyncClient(timeout=60) as client:
            sent = time.monotonic()
            standard = await client.post(
                f"{server.url}/v1/audio/speech",
                json={
                    "model": "cadenza-tiny",
                    "input": "a standard request",
                    "priority": "standard",
                    "response_format": "pcm",
                },
            )
            waited = time.monotonic() - sent
        return await level, standard, waited

    level, standard, waited = asyncio.run(overload())
    assert level["errors"] == 0, level["errors_by_reason"]
    assert level["admitted"] >= max_streams
    assert level["queued"] + level["rejected"] > 0  # the excess waited or was refused
    assert set(level["rejected_by_reason"]) <= {"queue_timeout", "queue_full"}
    if promised:
        assert level["c100"] >= 0.99, level
    assert level["ttfa_admitted_ms"]["p95"] <= 500, level["ttfa_admitted_ms"]
    assert standard.status_code == 200 and len(standard.content) > 0
    assert waited < 15.0  # its reserved share, well within its maximum wait, under realtime load
    assert server.metric("cadenza_admission_decisions_total") > 0
    _wait_idle(server)


@pytest.mark.parametrize("arrival", ["poisson", "burst"])
def test_poisson_and_burst_overload_keep_admitted_streams_on_time(server, arrival) -> None:
    """Three times the server's own claim, arriving at random (Poisson) or all in the same
    instant: every admitted stream keeps C100 and its TTFA; the excess is refused with a
    reason; nothing leaks. The claim counts nominal streams; these are shorter, so the
    real-time limit may admit more of them than the claim says: the burst is also at least
    twice the slot cap, so some of it must wait or be refused whatever the machine's speed."""
    max_streams = _capacity(server)["max_streams"]
    promised = _promises_real_time(server)
    sessions = 3 * max_streams if arrival == "poisson" else max(3 * max_streams, 2 * MAX_SEQS)
    mean_audio_s = 45 / 14  # 30-60 characters at the server's 14 characters per second
    options = LoadOptions(
        url=server.url,
        arrival=arrival,
        rate=3 * max_streams / mean_audio_s,
        duration_s=10.0,
        text_lengths=TextLengths(30, 60),
        client_buffer_ms=100.0,
        seed=7,
    )
    level = asyncio.run(run_level(options, sessions))
    assert level["errors"] == 0, level["errors_by_reason"]
    assert level["admitted"] >= 1
    assert set(level["rejected_by_reason"]) <= {"queue_timeout", "queue_full"}
    if arrival == "burst":
        assert level["offered"] == sessions
        assert level["rejected"] + level["queued"] > 0  # the excess waited or was refused
    if promised:
        assert level["c100"] >= 0.99, level
    assert level["ttfa_admitted_ms"]["p95"] <= 500, level["ttfa_admitted_ms"]
    _wait_idle(server)


def test_refusals_carry_a_reason_and_retry_after_on_http_and_websocket(slots) -> None:
    server = slots
    ws_url = server.url.replace("http", "ws") + "/v1/stream"

    async def scenario() -> None:
        holders = []
        sessions = []
        assert _capacity(server)["max_streams"] == MAX_SEQS
        for _ in range(MAX_SEQS):
            cm = connect(ws_url)
            session = await cm.__aenter__()
            sessions.append((cm, session))
            stream = session.speak("x" * 400, max_duration_s=30)
            await anext(stream)  # admitted and playing
            holders.append(stream)
        async with httpx.AsyncClient(timeout=60) as client:
            batch = await client.post(
                f"{server.url}/v1/audio/speech",
                json={"model": "cadenza-tiny", "input": "wait", "priority": "realtime"},
            )
        assert batch.status_code == 503
        assert batch.json()["error"]["code"] in ("queue_timeout", "queue_full")
        assert int(batch.headers["Retry-After"]) >= 1
        async with connect(ws_url) as extra:
            with pytest.raises(StreamError) as refused:
                async for _ in extra.speak("no room", priority="realtime"):
                    pass
            assert refused.value.code == "queue_timeout"
            assert refused.value.retry_after_s is not None and refused.value.retry_after_s >= 1
            # The slots free up in about 30 s, far past realtime's 2 s: refused at once, with
            # that wait as Retry-After, instead of after a pointless wait in the queue.
            assert extra.last_queued is None and refused.value.retry_after_s >= 10
        for stream in holders:
            await stream.aclose()
        for cm, _ in sessions:
            await cm.__aexit__(None, None, None)

    asyncio.run(scenario())
    _wait_idle(server)


def test_an_http_client_that_hangs_up_while_queued_leaves_the_queue(slots) -> None:
    server = slots
    ws_url = server.url.replace("http", "ws") + "/v1/stream"

    async def scenario() -> None:
        async with contextlib.AsyncExitStack() as stack:
            for _ in range(MAX_SEQS):  # every slot busy with a long stream
                session = await stack.enter_async_context(connect(ws_url))
                stream = session.speak("x" * 400, max_duration_s=30)
                stack.push_async_callback(stream.aclose)
                await anext(stream)
            async with httpx.AsyncClient(timeout=httpx.Timeout(1.0)) as client:
                with pytest.raises(httpx.ReadTimeout):  # the client gives up after 1 s
                    await client.post(
                        f"{server.url}/v1/audio/speech",
                        json={"model": "cadenza-tiny", "input": "gone", "priority": "standard"},
                    )
            # Standard requests may wait 60 s here (the slots free up in about 30 s, so it
            # queues); the departed one is out within a poll.
            deadline = time.monotonic() + 3
            while _capacity(server)["queued"]:
                assert time.monotonic() < deadline, "the departed request stayed queued"
                await asyncio.sleep(0.2)

    asyncio.run(scenario())
    _wait_idle(server)


def test_garbage_priority_is_refused_clearly(server) -> None:
    response = httpx.post(
        f"{server.url}/v1/audio/speech",
        json={"model": "cadenza-tiny", "input": "hi", "priority": "urgent"},
        timeout=30,
    )
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "priority"


def test_by_default_a_small_cpu_runs_one_replica_pinned_to_each_core(tmp_path) -> None:
    expected = default_replicas("cpu", "process")  # 2 on a 2-core machine, else 1
    with serving(tmp_path / "server.log", ENV, replicas=None) as server:
        body = httpx.get(f"{server.url}/admin/replicas", timeout=10).json()
        listed = body["models"]["cadenza-tiny"]
        assert len(listed) == expected
        if expected > 1:
            cores = [os.sched_getaffinity(replica["pid"]) for replica in listed]
            assert all(len(mine) == 1 for mine in cores)
            assert len(set().union(*cores)) == expected  # a core of its own each
        # uncalibrated: each replica's slots, added up
        assert _capacity(server)["max_streams"] == expected * MAX_SEQS
