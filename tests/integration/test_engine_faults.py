"""When the only engine process dies, requests waiting for a slot are refused at once (503)
instead of waiting out their queue time (tests/integration/test_availability.py has the
restart and the resumed streams)."""

from __future__ import annotations

import os
import signal
import threading
import time

import httpx

from tests.integration.server import RunningServer


def test_requests_waiting_for_a_slot_are_refused_when_the_engine_dies(tmp_path):
    """One slot, held by a long stream; a standard request waits for it (30 s allowed). The
    engine dies: the waiter gets 503 ``engine_unavailable`` at once, not after its wait."""
    server = RunningServer(tmp_path / "server.log", env={"CADENZA_ENGINE__MAX_NUM_SEQS": "1"})
    body = {"model": "cadenza-tiny", "response_format": "pcm"}
    result = {}

    def wait_for_slot() -> None:
        started = time.monotonic()
        response = httpx.post(
            f"{server.url}/v1/audio/speech", json={**body, "input": "me"}, timeout=60
        )
        result["response"], result["s"] = response, time.monotonic() - started

    try:
        server.wait_ready()
        with (
            httpx.Client(base_url=server.url, timeout=60) as http,
            http.stream("POST", "/v1/audio/speech", json={**body, "input": "x" * 400}) as holder,
        ):
            assert holder.status_code == 200
            waiter = threading.Thread(target=wait_for_slot)
            waiter.start()
            deadline = time.monotonic() + 10
            while http.get("/v1/capacity").json()["queued"] != 1:
                assert time.monotonic() < deadline, "the request never queued"
                time.sleep(0.1)
            (engine_pid,) = server.engine_pids()
            os.kill(engine_pid, signal.SIGKILL)
            waiter.join(20)
        response = result["response"]
        assert response.status_code == 503
        assert response.json()["error"]["code"] == "engine_unavailable"
        assert "Retry-After" in response.headers
        assert result["s"] < 10  # well before the 30 s standard wait
    finally:
        server.stop()
