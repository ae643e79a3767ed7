"""A server started without a C++ compiler serves on torch paths and says so: in ``/readyz``
(each replica's native kernels, and the line that says they are off), in ``/metrics`` (each
library's gauge at 0, status ``no_compiler``) and in its log (a warning from the engine)."""

from __future__ import annotations

import json

import httpx
import pytest

from cadenza.contract.native_kernels import NO_COMPILER_NOTE
from cadenza.kernels.native.entry_points import LIBRARIES
from tests.integration.server import serving


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    log_path = tmp_path_factory.mktemp("no-compiler") / "server.log"
    with serving(log_path, env={"CXX": "/nonexistent/c++"}) as running:
        yield running


def test_readyz_says_the_native_kernels_are_off(server) -> None:
    ready = httpx.get(f"{server.url}/readyz", timeout=10)
    assert ready.status_code == 200  # slower, still serving
    replica = ready.json()["models"]["cadenza-tiny"]["replicas"][0]
    kernels = replica["native_kernels"]
    assert kernels["summary"] == NO_COMPILER_NOTE
    assert set(kernels["libraries"]) == set(LIBRARIES)
    assert all(library["status"] == "no_compiler" for library in kernels["libraries"].values())


def test_metrics_count_no_kernel_loaded(server) -> None:
    text = httpx.get(f"{server.url}/metrics", timeout=10).text
    lines = [line for line in text.splitlines() if line.startswith("cadenza_native_kernel_loaded{")]
    assert len(lines) == len(LIBRARIES)
    assert all('status="no_compiler"' in line and line.endswith(" 0.0") for line in lines)


def test_the_engine_log_warns_and_speech_is_still_served(server) -> None:
    records = [
        json.loads(line) for line in server.log_path.read_text().splitlines() if line[:1] == "{"
    ]
    assert any(
        r["level"] == "warning"
        and r["process"].startswith("engine")
        and r["msg"] == NO_COMPILER_NOTE
        for r in records
    )
    body = {
        "model": "cadenza-tiny",
        "input": "Hi.",
        "voice": "default",
        "response_format": "pcm",
        "max_duration_s": 0.5,
    }
    response = httpx.post(f"{server.url}/v1/audio/speech", json=body, timeout=60)
    assert response.status_code == 200 and len(response.content) > 0
