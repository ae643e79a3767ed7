"""``benchmarks/gpu_kernels.py --interpret`` and ``benchmarks/gpu_check.py --cpu``: the GPU
checks' CPU halves pass."""

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


GPU_CHECK = SCRIPT.parent / "gpu_check.py"


def test_the_gpu_check_runs_on_the_cpu_at_tiny_shapes():
    done = subprocess.run(
        [sys.executable, str(GPU_CHECK), "--cpu"], capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(done.stdout)
    assert report["device"].startswith("cpu") and report["triton_ok"] is True
    assert report["shape"]["family"] == "orpheus"
    # The fixed-shape decode step traces as one graph: no host read inside it.
    assert report["fullgraph_compiled"] is True and report["fullgraph_break"] is None
    # The CPU runs the fixed shapes a GPU captures, eagerly: no graph, no memory for one.
    assert report["graphs"] == {"captured": False, "sizes": [1, 2, 4, 8], "memory_mb": 0.0}
    assert report["max_num_seqs"] == 8 and report["kv_pages"] > 0
    assert report["overlaps_steps"] is False  # CUDA's default; a CPU has nothing to overlap
    assert [bucket["batch"] for bucket in report["buckets"]] == [1, 2, 4]
    for bucket in report["buckets"]:
        assert bucket["step_ms"] > 0 and bucket["eager_ms"] > 0
        assert bucket["graphed_ms"] is None
    # Counted by the instrumentation a GPU run uses (cadenza.engine.device_audit).
    assert report["launches_per_step"] > 0 and report["host_reads_per_step"] >= 0
    # One read a step: the sampled ids with the NaN flags (docs/benchmarks.md, the GPU step
    # counted on the CPU); the forward's launches are one graph replay on CUDA.
    assert report["host_reads_per_step"] == 1
    assert 0 < report["launches_outside_forward"] < report["launches_per_step"]
    assert sum(report["host_reads_by_call"].values()) == pytest.approx(
        report["host_reads_per_step"], abs=0.1
    )
    assert [entry["streams"] for entry in report["snac"]] == [1, 8]
    assert all(entry["ms_per_stream_frame"] > 0 for entry in report["snac"])
    assert report["realtime_streams"] in (0, 1, 2) and "decode_attention" not in report


def test_its_wheels_are_what_it_imports_and_their_requirements_pinned_as_here():
    done = subprocess.run(
        [sys.executable, str(GPU_CHECK), "--requirements"], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    pinned = dict(entry.split("==") for entry in done.stdout.split())
    from importlib import metadata

    for name in ("transformers", "tokenizers", "safetensors", "pydantic", "numpy"):
        assert pinned[name] == metadata.version(name)
    assert "torch" not in pinned and "triton" not in pinned  # the GPU machine's own


def test_wheels_are_unpacked_behind_what_the_python_has(tmp_path, monkeypatch):
    import runpy
    import zipfile

    wheels = tmp_path / "wheels"
    wheels.mkdir()
    with zipfile.ZipFile(wheels / "probe-1.0-py3-none-any.whl", "w") as archive:
        archive.writestr("gpu_check_probe/__init__.py", "ANSWER = 42\n")
    script = runpy.run_path(str(GPU_CHECK), run_name="gpu_check_under_test")
    monkeypatch.setattr(sys, "path", list(sys.path))
    assert script["_use_wheels"](wheels, tmp_path / "site") == 1
    assert sys.path[-1] == str(tmp_path / "site")
    assert (tmp_path / "site" / "gpu_check_probe" / "__init__.py").read_text() == "ANSWER = 42\n"
    assert script["_use_wheels"](tmp_path / "none", tmp_path / "other") == 0


@pytest.mark.parametrize(
    ("options", "said"),
    [(["--cpu", "--layers", "0"], "--layers must be positive"), ([], "no CUDA device")],
)
def test_the_gpu_check_refuses_what_it_cannot_run(options, said):
    import torch

    if not options and torch.cuda.is_available():
        pytest.skip("a CUDA device is here")
    done = subprocess.run(
        [sys.executable, str(GPU_CHECK), *options], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 2 and said in done.stdout + done.stderr
