"""``cadenza loadtest`` against a real test server: a short run writes its three outputs, and a
burst beyond capacity reports refused streams with the server's reason."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.integration.server import serving


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    env = {
        "CADENZA_ENGINE__MAX_NUM_SEQS": "2",
        "CADENZA_ADMISSION__REALTIME_MAX_WAIT_S": "0.3",
    }
    # Uncalibrated: exactly two slots whatever this machine's speed, so the harness's own
    # accounting is what is checked.
    with serving(tmp_path_factory.mktemp("loadtest") / "server.log", env) as running:
        yield running


def _loadtest(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cadenza", "loadtest", "--quiet", *args],
        capture_output=True,
        text=True,
        timeout=180,
    )


def test_a_short_run_writes_report_json_markdown_and_plots(server, tmp_path) -> None:
    out = tmp_path / "report"
    done = _loadtest(
        "--url", server.url, "--concurrency", "2", "--duration", "3",
        "--text-lengths", "uniform:20-40", "--out", str(out),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert {p.rsplit("/", 1)[1] for p in summary["outputs"]} == {
        "report.json", "report.md", "ttfa_c100.png", "underrun_timeline.png",
    }  # fmt: skip
    report = json.loads((out / "report.json").read_text())
    level = report["levels"][0]
    assert level["concurrency"] == 2 and level["offered"] >= 2
    assert level["admitted"] == level["offered"] and level["errors"] == 0
    assert level["ttfa_ms"]["p50"] > 0 and level["c100"] is not None
    assert level["server"]["steps"] > 0 and level["client_cpu"] is not None
    assert report["server_max_streams"] == 2  # max_num_seqs caps the server's claim
    assert report["server_max_streams_after"] == 2
    assert report["ideal_streams"] is None  # uncalibrated: no measured throughput bound
    assert report["realtime_bound_streams"] is None  # nor a real-time one
    assert all(s["audio_s"] > 0 for s in level["streams"])
    assert (out / "ttfa_c100.png").read_bytes()[:4] == b"\x89PNG"
    assert "| 2 |" in (out / "report.md").read_text()


@pytest.mark.parametrize("transport", ["http", "webrtc"])
def test_other_transports_measure_streams_too(server, tmp_path, transport) -> None:
    done = _loadtest(
        "--url", server.url, "--transport", transport, "--concurrency", "1", "--duration", "1",
        "--text-lengths", "fixed:20", "--out", str(tmp_path),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    level = json.loads((tmp_path / "report.json").read_text())["levels"][0]
    assert level["admitted"] == level["offered"] >= 1 and level["errors"] == 0
    assert level["ttfa_ms"]["p50"] > 0
    # 20 characters at 14 per second; WebRTC counts the 20 ms frames its listener heard.
    assert level["streams"][0]["audio_s"] == pytest.approx(20 / 14, abs=0.1)


def test_text_streamed_at_a_language_models_pace_reports_segment_gaps(server, tmp_path) -> None:
    done = _loadtest(
        "--url", server.url, "--concurrency", "1", "--duration", "2", "--text-stream", "60",
        "--text-lengths", "fixed:120", "--out", str(tmp_path),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    level = json.loads((tmp_path / "report.json").read_text())["levels"][0]
    assert level["admitted"] == level["offered"] >= 1 and level["errors"] == 0
    text = level["text_stream"]
    assert text["segments"] > level["admitted"]  # 120 characters: more than one sentence
    assert text["segment_gap_ms"]["max"] is not None
    assert text["last_text_to_end_ms"]["p50"] > 0
    assert "Text streamed in" in (tmp_path / "report.md").read_text()


def test_a_burst_beyond_capacity_reports_refusals_with_reasons(server, tmp_path) -> None:
    done = _loadtest(
        "--url", server.url, "--arrival", "burst", "--concurrency", "6",
        "--text-lengths", "fixed:60", "--out", str(tmp_path),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    level = json.loads((tmp_path / "report.json").read_text())["levels"][0]
    assert level["offered"] == 6
    assert level["rejected"] >= 1
    assert set(level["rejected_by_reason"]) == {"queue_timeout"}
    assert level["admitted"] + level["rejected"] == 6
    assert not level["passed"] and json.loads(done.stdout)["capacity_streams"] is None


def test_garbage_options_and_unreachable_servers_fail_clearly(tmp_path) -> None:
    done = _loadtest("--url", "http://127.0.0.1:9", "--concurrency", "1", "--out", str(tmp_path))
    assert done.returncode == 2 and "unreachable" in done.stderr
    done = _loadtest(
        "--url", "http://127.0.0.1:9", "--concurrency", "1", "--text-lengths", "lots",
        "--out", str(tmp_path),
    )  # fmt: skip
    assert done.returncode == 2 and "text lengths" in done.stderr
    for bad, message in (
        (["--concurrency", "0"], "--concurrency"),
        (["--concurrency", "1", "--duration", "-3"], "--duration"),
        (["--concurrency", "1", "--client-buffer-ms", "-1"], "--client-buffer-ms"),
        (["--sweep", "--start", "9", "--limit", "4"], "--start"),
        (["--concurrency", "1", "--chaos-kill-every", "soon"], "--chaos-kill-every"),
        (["--concurrency", "1", "--chaos-kill-every", "9-3"], "--chaos-kill-every"),
        (["--concurrency", "1", "--text-stream", "0"], "--text-stream"),
        (["--concurrency", "1", "--text-stream", "9", "--transport", "http"], "--text-stream"),
    ):
        done = _loadtest("--url", "http://127.0.0.1:9", *bad, "--out", str(tmp_path))
        assert done.returncode == 2 and message in done.stderr, done.stderr
    done = _loadtest("--url", "ftp://x", "--concurrency", "1", "--out", str(tmp_path))
    assert done.returncode == 2 and "--url" in done.stderr
