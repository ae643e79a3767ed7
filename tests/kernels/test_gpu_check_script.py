"""``benchmarks/gpu_kernels.py --interpret``: the CPU half of ``make gpu-check`` passes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_kernels.py"


def test_interpreter_half_of_the_gpu_check_passes():
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--interpret"], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(done.stdout)
    kernels = {check["kernel"] for check in report["checks"]}
    assert kernels == {"paged_decode_attention", "w8a16"}
    assert all(check["ok"] for check in report["checks"])
