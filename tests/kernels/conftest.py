"""Instruction-set levels for the native kernels' reference tests.

A test that takes the ``isa_level`` fixture runs once per level the kernels branch on:
``native`` (whatever this CPU has: AVX-512 with BF16 dot products on the development machine)
and ``x86-64-v3`` (AVX2 and FMA), or the levels ``$CADENZA_TEST_ISA_LEVELS`` names
(comma-separated, e.g. ``native,x86-64-v4,x86-64-v3``). The same sources are compiled for each;
the wrappers load the level's build for the test (:func:`loader.select_level`), and every
library must load there. A level this CPU cannot run, or a machine without a C++ compiler, is
skipped with the reason. The terminal summary (and the header, run as ``pytest tests/kernels``)
says which levels ran, with the ISA of each.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterator

import pytest

from cadenza.kernels import cpu_linear
from cadenza.kernels.native import isa, loader

TEST_LEVELS = tuple(
    level.strip()
    for level in os.environ.get("CADENZA_TEST_ISA_LEVELS", "native,x86-64-v3").split(",")
    if level.strip()
)

_ran: Counter[str] = Counter()  # "level (isa)" -> tests set up at it
_skipped: dict[str, str] = {}  # level -> why


def _why_not(level: str) -> tuple[str | None, str]:
    """(why this machine cannot run ``level``'s build, or ``None``; the build's ISA)."""
    compiler = loader.find_compiler()
    if compiler is None:
        return "no C++ compiler on this machine", ""
    try:
        build = isa.probe(compiler, level)
    except (ValueError, RuntimeError) as exc:
        return str(exc), ""
    if build.missing:
        return f"this CPU lacks {', '.join(build.missing)}", build.isa
    return None, build.isa


def _use_level(level: str | None) -> None:
    loader.select_level(level)
    cpu_linear.native_linear_library.cache_clear()  # the one wrapper that keeps a library


@pytest.fixture(params=TEST_LEVELS)
def isa_level(request: pytest.FixtureRequest) -> Iterator[str]:
    """The level this test's kernels are built for (see the module)."""
    level: str = request.param
    reason, build_isa = _why_not(level)
    if reason is not None:
        _skipped[level] = reason
        pytest.skip(f"{level}: {reason}")
    off = [f"{k.library}: {k.status} {k.detail}" for k in loader.report(level) if not k.loaded]
    if off:
        pytest.fail(f"native kernels that do not load at {level}: {'; '.join(off)}")
    _ran[f"{level} ({build_isa})"] += 1
    _use_level(level)
    try:
        yield level
    finally:
        _use_level(None)


@pytest.fixture
def no_compiler(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No C++ compiler for the test: every library is off (nothing loaded is remembered)."""
    monkeypatch.setattr(loader, "find_compiler", lambda: None)
    loader.clear_cache()
    cpu_linear.native_linear_library.cache_clear()
    try:
        yield
    finally:
        loader.clear_cache()  # the compiler comes back with the monkeypatch
        cpu_linear.native_linear_library.cache_clear()


def pytest_report_header() -> str:
    levels = []
    for level in TEST_LEVELS:
        reason, build_isa = _why_not(level)
        levels.append(f"{level} ({build_isa})" if reason is None else f"{level} (skip: {reason})")
    default = os.environ.get(isa.LEVEL_ENV) or isa.DEFAULT_LEVEL
    return f"native kernel levels: {', '.join(levels)}; serving level {default}"


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not _ran and not _skipped:
        return
    ran = ", ".join(f"{level}: {count} tests" for level, count in sorted(_ran.items()))
    terminalreporter.write_sep("-", "native kernel levels")
    terminalreporter.write_line(f"ran at {ran or 'no level'}")
    for level, reason in sorted(_skipped.items()):
        terminalreporter.write_line(f"skipped {level}: {reason}")
