"""The scripts in ``benchmarks/`` still load and parse their options against today's code, and
two of them run end to end at their smallest sizes (a few seconds). What they measure, and on
which machine, is in docs/benchmarks.md; this only keeps them runnable."""

from __future__ import annotations

import contextlib
import io
import os
import runpy
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCHMARKS = ROOT / "benchmarks"
SCRIPTS = sorted(path.name for path in BENCHMARKS.glob("*.py"))

# Scripts without options: running them as ``__main__`` runs the whole benchmark, so they are
# only loaded here.
WITHOUT_OPTIONS = {"codec_convs.py", "cpu_attention.py", "gc_pauses.py"}


@pytest.fixture
def isolated_imports() -> Iterator[None]:
    """Some scripts put ``benchmarks/`` on ``sys.path`` and import their siblings by name:
    leave neither behind for the tests that follow."""
    saved_path, saved_modules = sys.path[:], set(sys.modules)
    saved_argv = sys.argv
    try:
        yield
    finally:
        sys.argv = saved_argv
        sys.path[:] = saved_path
        for name in set(sys.modules) - saved_modules:
            module_file = getattr(sys.modules[name], "__file__", None) or ""
            if Path(module_file).parent == BENCHMARKS:
                del sys.modules[name]


def test_every_script_without_options_is_known() -> None:
    without = {name for name in SCRIPTS if "ArgumentParser" not in (BENCHMARKS / name).read_text()}
    assert without == WITHOUT_OPTIONS


@pytest.mark.parametrize("script", SCRIPTS)
def test_the_script_loads(script: str, isolated_imports: None) -> None:
    namespace = runpy.run_path(str(BENCHMARKS / script), run_name="benchmark_smoke")
    assert callable(namespace.get("main")) or script == "cpu_attention.py"


@pytest.mark.parametrize("script", sorted(set(SCRIPTS) - WITHOUT_OPTIONS))
def test_help_lists_the_options(script: str, isolated_imports: None) -> None:
    sys.argv = [script, "--help"]
    printed = io.StringIO()
    with pytest.raises(SystemExit) as exited, contextlib.redirect_stdout(printed):
        runpy.run_path(str(BENCHMARKS / script), run_name="__main__")
    assert exited.value.code == 0
    assert printed.getvalue().startswith("usage:")


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    paths = [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}
    return subprocess.run(
        [sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )


def test_the_sampler_draw_runs_end_to_end() -> None:
    done = _run("benchmarks/sampler_draw.py", "--rounds", "2")
    assert done.returncode == 0, done.stderr
    batches = [line for line in done.stdout.splitlines() if line.startswith("batch")]
    assert len(batches) == 4 and all("ratio" in line for line in batches)


def test_the_sampler_mask_runs_end_to_end_on_an_engine() -> None:
    done = _run("benchmarks/sampler_mask_ab.py", "--rows", "1", "--rounds", "1")
    assert done.returncode == 0, done.stderr
    rows = [line for line in done.stdout.splitlines() if line.startswith("| 1 |")]
    assert len(rows) == 1
