"""Graceful drain: SIGTERM (or ``POST /admin/drain``) lets open streams finish, refuses new
ones with 503 ``shutting_down``, turns ``/readyz`` 503, ends what outlives the drain timeout
with ``shutting_down``, and exits 0."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import threading
import time
from pathlib import Path

import httpx
import pytest

from cadenza.client.sdk import StreamError, connect
from tests.integration.server import RunningServer

DETERMINISTIC = {"CADENZA_CALIBRATION__MODE": "off", "CADENZA_ADMISSION__SLACK_CLOSE_MS": "-1e9"}


def start(tmp_path, **env: str) -> RunningServer:
    server = RunningServer(tmp_path / "server.log", {**DETERMINISTIC, **env})
    server.wait_ready()
    return server


def exit_code(server: RunningServer, timeout_s: float = 60) -> int:
    try:
        return server.process.wait(timeout=timeout_s)
    finally:
        server.stop()


def test_sigterm_lets_open_streams_finish_and_refuses_new_ones(tmp_path) -> None:
    server = start(tmp_path)
    body = {"model": "cadenza-tiny", "input": "x" * 56, "response_format": "pcm"}  # 4 s
    sizes: list[int] = []
    first_bytes = threading.Barrier(3)

    def listen() -> None:
        received = 0
        with httpx.stream("POST", f"{server.url}/v1/audio/speech", json=body, timeout=60) as r:
            for data in r.iter_bytes():
                if not received:
                    first_bytes.wait(30)
                received += len(data)
        sizes.append(received)

    listeners = [threading.Thread(target=listen) for _ in range(2)]
    for listener in listeners:
        listener.start()
    first_bytes.wait(30)
    server.process.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 10
    while (ready := httpx.get(f"{server.url}/readyz", timeout=10)).status_code != 503:
        assert time.monotonic() < deadline, "readiness did not turn off"
        time.sleep(0.05)
    assert ready.json()["status"] == "draining"
    refused = httpx.post(f"{server.url}/v1/audio/speech", json=body, timeout=10)
    assert refused.status_code == 503 and refused.json()["error"]["code"] == "shutting_down"
    assert int(refused.headers["Retry-After"]) >= 1
    offer = httpx.post(f"{server.url}/v1/webrtc/offer", json={"sdp": "x", "type": "offer"})
    assert offer.status_code == 503 and offer.json()["error"]["code"] == "shutting_down"

    async def websocket_refusal() -> StreamError:
        with pytest.raises(StreamError) as refused:
            async with connect(server.url.replace("http", "ws") + "/v1/stream"):
                pass
        return refused.value

    refusal = asyncio.run(websocket_refusal())  # the upgrade itself: a front door retries it
    assert refusal.code == "shutting_down" and refusal.retry_after_s is not None
    for listener in listeners:
        listener.join(60)
    assert sizes == [4 * 24000 * 2] * 2  # every open stream played to its end
    assert exit_code(server) == 0


def test_streams_past_the_drain_timeout_end_with_shutting_down(tmp_path) -> None:
    server = start(tmp_path, CADENZA_SERVER__DRAIN_TIMEOUT_S="1")

    async def long_stream() -> StreamError:
        async with connect(server.url.replace("http", "ws") + "/v1/stream") as session:
            with pytest.raises(StreamError) as ended:
                async for _ in session.speak("x" * 400, max_duration_s=25):
                    if server.process.returncode is None and not signalled:
                        signalled.append(True)
                        server.process.send_signal(signal.SIGTERM)
            return ended.value

    signalled: list[bool] = []
    started = time.monotonic()
    error = asyncio.run(long_stream())
    assert error.code == "shutting_down"
    assert exit_code(server) == 0
    assert time.monotonic() - started < 20  # the drain timeout, not the stream, set the end


def test_admin_drain_exits_when_nothing_is_open(tmp_path) -> None:
    server = start(tmp_path)
    response = httpx.post(f"{server.url}/admin/drain", timeout=10)
    assert response.status_code == 202 and response.json()["open_streams"] == 0
    assert exit_code(server, timeout_s=30) == 0


def _children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (Linux: from /proc)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[1]) == pid:
                found.append(int(stat.parent.name))
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_sigterm_while_the_engines_calibrate_stops_them_and_exits_0(tmp_path) -> None:
    # A first start calibrates for tens of seconds; a signal then stops the node there, its
    # engines with it, instead of once the calibration is done.
    cache = tmp_path / "calibrations"
    server = RunningServer(tmp_path / "server.log", {"CADENZA_CALIBRATION__CACHE_DIR": str(cache)})
    deadline = time.monotonic() + 90
    while "calibrating" not in server.log_path.read_text():
        assert server.process.poll() is None, server.log_path.read_text()
        assert time.monotonic() < deadline, "the engine did not start calibrating"
        time.sleep(0.1)
    engines = _children(server.process.pid)
    assert engines, "the engine runs in a process of its own"
    server.process.send_signal(signal.SIGTERM)
    assert exit_code(server, timeout_s=60) == 0
    log = server.log_path.read_text()
    assert "while starting" in log and "Traceback" not in log
    assert "engine ready" not in log  # stopped in the calibration, not at its end
    assert not [pid for pid in engines if _alive(pid)]
