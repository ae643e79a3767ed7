"""Availability with real clients against the real server: an engine replica killed (or hung)
mid-stream, and the stream goes on after a gap with the tokens it would have had; a lost
engine is restarted and the server is ready again; a model that cannot start any more says
why; a rolling restart moves nothing; nothing leaks on either side."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import httpx
import numpy as np
import pytest

from cadenza.client.sdk import StreamError, connect
from cadenza.client.webrtc import WebRTCPeer
from tests.integration.server import serving

FLOAT32 = {  # the uninterrupted and the resumed run are compared value for value
    "CADENZA_CPU__LINEAR_DTYPE": "float32",
    "CADENZA_CPU__CODEC_DTYPE": "float32",
}
TEXT = "a stream that outlives the engine it started on"  # 3.4 s of audio


@pytest.fixture(scope="module")
def replicated(tmp_path_factory):
    """Two engine replicas of cadenza-tiny."""
    env = {**FLOAT32, "CADENZA_SUPERVISION__REPLICAS": "2"}
    with serving(tmp_path_factory.mktemp("replicated") / "server.log", env) as running:
        running.idle_tasks = running.metric("cadenza_edge_asyncio_tasks")
        yield running


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    """One replica, which the edge must restart; a short heartbeat timeout (hang test)."""
    env = {**FLOAT32, "CADENZA_SUPERVISION__HEARTBEAT_TIMEOUT_S": "3"}
    with serving(tmp_path_factory.mktemp("single") / "server.log", env) as running:
        running.idle_tasks = running.metric("cadenza_edge_asyncio_tasks")
        yield running


def replicas(server) -> list[dict]:
    return httpx.get(f"{server.url}/admin/replicas", timeout=10).json()["models"]["cadenza-tiny"]


def serving_pid(server) -> int:
    """The process id of the replica that holds the (one) open stream."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        busy = [r["pid"] for r in replicas(server) if r["streams"]]
        if busy:
            return busy[0]
        time.sleep(0.05)
    raise AssertionError("no replica holds the stream")


def wait_all_ready(server, timeout_s: float = 60) -> float:
    """Seconds until every replica is ready again (and /readyz says so)."""
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        states = [r["status"] for r in replicas(server)]
        ready = httpx.get(f"{server.url}/readyz", timeout=10).status_code == 200
        if ready and all(s == "ready" for s in states):
            return time.monotonic() - started
        time.sleep(0.1)
    raise AssertionError(f"replicas not ready: {replicas(server)}")


def wait_idle(server, timeout_s: float = 20) -> None:
    """Nothing held on either side: no admitted or queued stream, every KV page free, no
    engine request, no open stream, no more edge tasks than when the server was idle first."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        capacity = httpx.get(f"{server.url}/v1/capacity", timeout=10).json()
        if (
            capacity["active"] == 0
            and capacity["queued"] == 0
            and capacity["resuming"] == 0
            and capacity["kv_pages_free"] == capacity["kv_pages_total"]
            and server.metric("cadenza_engine_requests") == 0
            and server.metric("cadenza_streams_active") == 0
            and server.metric("cadenza_edge_asyncio_tasks") <= server.idle_tasks
        ):
            return
        time.sleep(0.2)
    raise AssertionError(f"server did not return to idle: {capacity}")


async def speak_codes(server, kill_after_chunks: int | None = None) -> tuple[list[bytes], int]:
    """The greedy stream's codec frames over the SDK; with ``kill_after_chunks``, the replica
    serving it is SIGKILLed once that many chunks arrived. Returns the frames and the pid
    killed (0: none)."""
    chunks: list[bytes] = []
    killed = 0
    async with connect(server.url.replace("http", "ws") + "/v1/stream") as session:
        async for chunk in session.speak(TEXT, format="encodec", temperature=0):
            chunks.append(chunk.data)
            if kill_after_chunks is not None and len(chunks) == kill_after_chunks:
                killed = await asyncio.to_thread(serving_pid, server)
                os.kill(killed, signal.SIGKILL)
    return chunks, killed


def frames(chunks: list[bytes]) -> np.ndarray:
    return np.frombuffer(b"".join(chunks), dtype="<u2")


def test_a_killed_replica_s_stream_resumes_on_the_other_with_the_same_codes(replicated) -> None:
    reference, _ = asyncio.run(speak_codes(replicated))
    resumes = replicated.metric('cadenza_stream_resumes_total{model="cadenza-tiny",outcome="re')
    resumed, killed = asyncio.run(speak_codes(replicated, kill_after_chunks=3))
    assert killed and killed not in [r["pid"] for r in replicas(replicated)]
    np.testing.assert_array_equal(frames(resumed), frames(reference))
    after = replicated.metric('cadenza_stream_resumes_total{model="cadenza-tiny",outcome="re')
    assert after == resumes + 1
    assert replicated.metric("cadenza_stream_resume_gap_seconds_count") >= 1
    assert httpx.get(f"{replicated.url}/readyz").status_code == 200  # the other one was ready
    wait_all_ready(replicated)
    assert replicated.metric("cadenza_engine_restarts_total") >= 1
    wait_idle(replicated)


def test_an_http_body_survives_the_kill_whole_and_equal(replicated) -> None:
    body = {"model": "cadenza-tiny", "input": TEXT, "response_format": "pcm", "temperature": 0}
    reference = httpx.post(f"{replicated.url}/v1/audio/speech", json=body, timeout=60).content
    received = b""
    with httpx.stream(
        "POST", f"{replicated.url}/v1/audio/speech", json=body, timeout=60
    ) as response:
        for data in response.iter_bytes():
            if not received:
                os.kill(serving_pid(replicated), signal.SIGKILL)
            received += data
    assert len(received) == len(reference)
    got = np.frombuffer(received, "<i2").astype(np.int32)
    want = np.frombuffer(reference, "<i2").astype(np.int32)
    assert np.abs(got - want).max() <= 2  # s16 rounding of float32-equal audio
    wait_all_ready(replicated)
    wait_idle(replicated)


def test_a_webrtc_utterance_survives_the_kill(replicated) -> None:
    async def main() -> dict:
        peer = WebRTCPeer(replicated.url)
        try:
            await peer.connect()
            peer.send({"type": "speak", "text": TEXT, "temperature": 0})
            await peer.next_event({"started"})
            while peer.result.loud_samples() == 0:
                await asyncio.sleep(0.05)
            os.kill(await asyncio.to_thread(serving_pid, replicated), signal.SIGKILL)
            return await peer.next_event({"done", "error"}, timeout_s=60)
        finally:
            await peer.close()

    done = asyncio.run(main())
    assert done["type"] == "done" and done["reason"] in ("length", "eos"), done
    wait_all_ready(replicated)
    wait_idle(replicated)


def test_a_rolling_restart_replaces_every_replica_and_moves_no_stream(replicated) -> None:
    before = {r["pid"] for r in replicas(replicated)}
    unknown = httpx.post(f"{replicated.url}/admin/restart", params={"model": "nope"})
    assert unknown.status_code == 400 and unknown.json()["error"]["code"] == "model_not_found"

    async def speak_while_restarting() -> tuple[int, list[int]]:
        codes = 0
        statuses: list[int] = []
        async with (
            connect(replicated.url.replace("http", "ws") + "/v1/stream") as session,
            httpx.AsyncClient(base_url=replicated.url) as http,
        ):
            async for chunk in session.speak(TEXT, format="encodec", temperature=0):
                codes += len(chunk.data)
                if not statuses:
                    restart = await http.post("/admin/restart")
                    assert restart.status_code == 202
                    again = await http.post("/admin/restart")  # one rollout at a time
                    assert again.status_code == 409 and again.json()["error"]["code"] == "busy"
                statuses.append((await http.get("/readyz")).status_code)
        return codes, statuses

    resumes = replicated.metric("cadenza_stream_resumes_total")
    codes, statuses = asyncio.run(speak_while_restarting())
    assert codes > 0 and set(statuses) == {200}  # one replica served throughout
    wait_all_ready(replicated, timeout_s=90)
    assert not before & {r["pid"] for r in replicas(replicated)}
    assert replicated.metric("cadenza_stream_resumes_total") == resumes  # nothing moved
    wait_idle(replicated)


def test_one_replica_is_restarted_and_its_stream_resumes(single) -> None:
    reference, _ = asyncio.run(speak_codes(single))
    restarts = single.metric("cadenza_engine_restarts_total")

    async def kill_and_probe() -> tuple[list[bytes], dict]:
        probes: dict = {}

        async def probe_while_down() -> None:
            async with httpx.AsyncClient(base_url=single.url, timeout=10) as http:
                for _ in range(200):
                    ready = await http.get("/readyz")
                    if ready.status_code == 503:
                        probes["readyz"] = ready
                        probes["speech"] = await http.post(
                            "/v1/audio/speech", json={"model": "cadenza-tiny", "input": "hi"}
                        )
                        probes["models"] = await http.get("/v1/models")
                        try:
                            async with connect(single.url.replace("http", "ws") + "/v1/stream"):
                                probes["websocket"] = None
                        except StreamError as refused:
                            probes["websocket"] = refused
                        return
                    await asyncio.sleep(0.02)

        stream = asyncio.create_task(speak_codes(single, kill_after_chunks=3))
        while not stream.done() and not single.metric("cadenza_engine_crashes_total"):
            await asyncio.sleep(0.02)
        await probe_while_down()
        chunks, _ = await stream
        return chunks, probes

    crashes = single.metric("cadenza_engine_crashes_total")
    assert crashes == 0
    resumed, probes = asyncio.run(kill_and_probe())
    np.testing.assert_array_equal(frames(resumed), frames(reference))
    assert probes["readyz"].json()["models"]["cadenza-tiny"]["replicas"][0]["status"] in (
        "restarting",
        "starting",
    )
    assert int(probes["readyz"].headers["Retry-After"]) >= 1
    speech = probes["speech"]
    assert speech.status_code == 503 and int(speech.headers["Retry-After"]) >= 1
    assert speech.json()["error"]["code"] == "engine_unavailable"
    assert probes["models"].status_code == 200  # the model is still this server's
    refused = probes["websocket"]  # the upgrade itself is refused, as a front door retries
    assert refused.code == "engine_unavailable" and refused.retry_after_s >= 1
    wait_all_ready(single)
    assert single.metric("cadenza_engine_restarts_total") == restarts + 1
    assert single.metric("cadenza_engine_time_to_ready_seconds_count") >= 1
    wait_idle(single)


def test_a_hung_engine_is_killed_and_replaced_and_the_stream_resumes(single) -> None:
    async def hang_it() -> tuple[list[bytes], int]:
        chunks: list[bytes] = []
        hung = 0
        async with connect(single.url.replace("http", "ws") + "/v1/stream") as session:
            async for chunk in session.speak(TEXT, format="encodec", temperature=0):
                chunks.append(chunk.data)
                if len(chunks) == 3:
                    hung = await asyncio.to_thread(serving_pid, single)
                    os.kill(hung, signal.SIGSTOP)  # alive, silent
        return chunks, hung

    reference, _ = asyncio.run(speak_codes(single))
    resumed, hung = asyncio.run(hang_it())
    try:
        np.testing.assert_array_equal(frames(resumed), frames(reference))
        assert hung not in [r["pid"] for r in replicas(single)]
        wait_all_ready(single)
        wait_idle(single)
    finally:
        with_process = os.path.exists(f"/proc/{hung}")
        if with_process:
            os.kill(hung, signal.SIGKILL)


def test_a_model_that_can_no_longer_start_stops_being_restarted_and_says_why(
    tmp_path_factory,
) -> None:
    pytest.importorskip("snac")
    from tests.unit.engine.orpheus_checkpoints import save_tiny_orpheus_and_snac

    root = tmp_path_factory.mktemp("crash-loop")
    orpheus_dir, snac_dir = save_tiny_orpheus_and_snac(root)
    env = {
        "CADENZA_SUPERVISION__MAX_START_FAILURES": "2",
        "CADENZA_SUPERVISION__RESTART_BACKOFF_S": "0.1",
    }
    args = ("--model", str(orpheus_dir), "--codec", str(snac_dir))
    with serving(root / "server.log", env, args=args) as server:
        ((name, (replica,)),) = httpx.get(f"{server.url}/admin/replicas").json()["models"].items()
        orpheus_dir.rename(root / "gone")  # the checkpoint vanished: every start now fails
        os.kill(replica["pid"], signal.SIGKILL)
        deadline = time.monotonic() + 60
        while (ready := httpx.get(f"{server.url}/readyz")).json()["models"][name]["replicas"][0][
            "status"
        ] != "failed":
            assert time.monotonic() < deadline, ready.json()
            time.sleep(0.2)
        state = ready.json()["models"][name]["replicas"][0]
        assert ready.status_code == 503 and state["status"] == "failed"
        assert "error" not in state  # /readyz is public: the reason is for operators
        ((admin_state,),) = httpx.get(f"{server.url}/admin/replicas").json()["models"].values()
        why = admin_state["last_error"]
        assert "not restarting" in why and "failed to load" in why
        body = {"model": name, "input": "hi", "voice": "tara"}
        refused = httpx.post(f"{server.url}/v1/audio/speech", json=body, timeout=10)
        assert refused.status_code == 503 and int(refused.headers["Retry-After"]) >= 1
        assert "is down" in refused.json()["error"]["message"]
        assert "not restarting" in server.log_path.read_text()


def test_a_chaos_run_kills_replicas_and_every_admitted_stream_completes(
    replicated, tmp_path
) -> None:
    import json
    import subprocess
    import sys

    done = subprocess.run(
        [
            sys.executable, "-m", "cadenza", "loadtest", "--quiet", "--url", replicated.url,
            "--concurrency", "2", "--duration", "10", "--text-lengths", "uniform:40-60",
            "--chaos-kill-every", "4-5", "--out", str(tmp_path),
        ],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    (level,) = json.loads((tmp_path / "report.json").read_text())["levels"]
    chaos = level["chaos"]
    assert chaos["kills"] >= 2 and chaos["time_to_ready_s"]["not_back"] == 0
    assert chaos["completed_share"] == 1.0, chaos["broken_by_reason"]
    assert set(chaos["gaps_ms"]) == {"count", "p50", "p99", "max"}  # a gap may be covered
    wait_all_ready(replicated)
    wait_idle(replicated)


def test_a_warm_spare_takes_over_a_killed_engine_at_once(tmp_path) -> None:
    env = {**FLOAT32, "CADENZA_SUPERVISION__WARM_SPARE": "true"}
    with serving(tmp_path / "server.log", env) as server:
        server.idle_tasks = server.metric("cadenza_edge_asyncio_tasks")
        deadline = time.monotonic() + 60
        while replicas(server)[0]["spare"] != "ready":  # the engine and its loaded spare
            assert time.monotonic() < deadline, "no warm spare was loaded"
            time.sleep(0.2)
        assert len(server.engine_pids()) == 2
        reference, _ = asyncio.run(speak_codes(server))
        spare = (set(server.engine_pids()) - {r["pid"] for r in replicas(server)}).pop()
        resumed, _ = asyncio.run(speak_codes(server, kill_after_chunks=3))
        np.testing.assert_array_equal(frames(resumed), frames(reference))
        (replica,) = replicas(server)
        assert replica["pid"] == spare and replica["status"] == "ready"
        gap = server.metric("cadenza_stream_resume_gap_seconds_sum")
        assert 0 < gap < 3.0  # the spare was loaded: no process start in the gap
        assert server.metric("cadenza_engine_time_to_ready_seconds_sum") < 3.0
        deadline = time.monotonic() + 60
        while len(server.engine_pids()) < 2:  # a new spare loads behind it
            assert time.monotonic() < deadline, "the spare was not replaced"
            time.sleep(0.2)
        wait_idle(server)
        # Stop the server while a new spare is still loading: no engine outlives it.
        os.kill(replicas(server)[0]["pid"], signal.SIGKILL)
        deadline = time.monotonic() + 10
        while len(server.engine_pids()) < 2:  # the next spare's process has started
            assert time.monotonic() < deadline
            time.sleep(0.05)
        engines = server.engine_pids()
    deadline = time.monotonic() + 30
    while alive := [pid for pid in engines if os.path.exists(f"/proc/{pid}")]:
        assert time.monotonic() < deadline, f"engine processes outlived the server: {alive}"
        time.sleep(0.2)
