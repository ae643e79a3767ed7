"""``cadenza bench``: each benchmark runs end to end at its smallest size and prints its JSON;
bad options are refused clearly. (The numbers themselves live in docs/benchmarks.md.)"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest


def _bench(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cadenza", "bench", *args],
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.parametrize("target", ["engine", "codec", "snac"])
def test_the_smallest_run_prints_side_by_side_results(target) -> None:
    done = _bench(target, "--batch-sizes", "1", "--repeats", "1", "--json")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["benchmark"] == target and len(result["results"]) == 1
    assert result["results"][0]["speedup"] > 0
    if target == "engine":
        assert result["roofline"]["gemm_gflops_2048"] > 0
    if target == "snac":
        assert result["error_vs_offline"]["cadenza_max_abs"] < 1e-4


@pytest.mark.parametrize("options", [["--batch-sizes", "x"], ["--batch-sizes", "0"]])
def test_bad_options_are_refused(options) -> None:
    done = _bench("codec", *options)
    assert done.returncode == 2 and "cadenza:" in done.stderr
