"""When the engine process dies, the edge says so (503) instead of hanging, and keeps running."""

from __future__ import annotations

import os
import signal
import time

import httpx

from tests.integration.server import RunningServer


def test_engine_death_turns_readiness_off_and_requests_into_503(tmp_path):
    server = RunningServer(tmp_path / "server.log")
    try:
        server.wait_ready()
        with httpx.Client(base_url=server.url, timeout=30) as http:
            (engine_pid,) = server.engine_pids()
            os.kill(engine_pid, signal.SIGKILL)
            deadline = time.monotonic() + 10
            while http.get("/readyz").status_code != 503:
                assert time.monotonic() < deadline, "readiness did not notice the dead engine"
                time.sleep(0.1)
            response = http.post("/v1/audio/speech", json={"model": "cadenza-tiny", "input": "hi"})
            assert response.status_code == 503
            assert response.json()["error"]["code"] == "engine_unavailable"
            assert http.get("/healthz").status_code == 200
    finally:
        server.stop()
