"""HAProxy for a test: ``haproxy -f CFG -db`` (foreground) on loopback ports, ready once they
accept connections, stopped at the end; and ``haproxy -c`` on a configuration text.

Skips the test when ``haproxy`` is missing (``make infra`` installs it). The fixture
``haproxy`` starts one per call and stops them all after the test; a module that shares one
between tests uses :func:`running_haproxy` in a module fixture.
"""

from __future__ import annotations

import itertools
import subprocess
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path

import pytest

from tests.support.background_process import BackgroundProcess, require_binary


def require_haproxy() -> str:
    return require_binary("haproxy", "haproxy")


def check_config(text: str, directory: Path) -> subprocess.CompletedProcess[str]:
    """``haproxy -c -f`` on ``text`` (written to ``directory/haproxy.cfg``): return code 0
    when HAProxy would start with it, its complaints in ``stdout``/``stderr`` otherwise."""
    path = directory / "haproxy.cfg"
    path.write_text(text)
    return subprocess.run(
        [require_haproxy(), "-c", "-f", str(path)], capture_output=True, text=True, timeout=30
    )


@contextmanager
def running_haproxy(
    text: str, directory: Path, ports: Sequence[int]
) -> Iterator[BackgroundProcess]:
    """HAProxy running ``text`` until the block ends, ready once every one of ``ports`` (the
    loopback ports it binds) accepts connections; its log is ``directory/haproxy.log``."""
    config = directory / "haproxy.cfg"
    config.write_text(text)
    process = BackgroundProcess(
        [require_haproxy(), "-f", str(config), "-db"], directory / "haproxy.log"
    )
    try:
        process.wait_listening(ports)
        yield process
    finally:
        process.stop()


@pytest.fixture
def haproxy(tmp_path: Path) -> Iterator[Callable[[str, Sequence[int]], BackgroundProcess]]:
    """``start(config_text, ports)``: a ready HAProxy, stopped after the test."""
    numbers = itertools.count()
    with ExitStack() as stack:

        def start(text: str, ports: Sequence[int]) -> BackgroundProcess:
            directory = tmp_path / f"haproxy-{next(numbers)}"
            directory.mkdir()
            return stack.enter_context(running_haproxy(text, directory, ports))

        yield start
