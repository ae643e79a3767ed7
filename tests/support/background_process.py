"""A server program a test starts and stops: in its own session (so that stopping it stops
whatever it started too), its output in a log file, ready once its ports accept connections.

:mod:`tests.support.haproxy_process` and :mod:`tests.support.redis_process` are built on it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

STOP_TIMEOUT_S = 5.0


def require_binary(name: str, package: str) -> str:
    """The path of ``name``, or skip the test: ``make infra`` installs Debian's ``package``."""
    path = shutil.which(name)
    if path is None:
        pytest.skip(f"{name} is not installed (`make infra` installs Debian's {package})")
    return path


class BackgroundProcess:
    """``argv`` running with its output in ``log_path``; :meth:`stop` ends it and its
    children (its process group, which is its own)."""

    def __init__(self, argv: Sequence[str], log_path: Path) -> None:
        self.argv = list(argv)
        self.log_path = log_path
        self._log = log_path.open("wb")
        self.process = subprocess.Popen(
            self.argv, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True
        )

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_listening(self, ports: Sequence[int], timeout_s: float = 10.0) -> None:
        """Return once every port in ``ports`` accepts a connection on 127.0.0.1. Raises
        ``RuntimeError`` (with the log) if the process exits or ``timeout_s`` passes."""
        deadline = time.monotonic() + timeout_s
        waiting = list(ports)
        while waiting:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"{self.argv[0]} exited ({self.process.returncode}):\n{self.log()}"
                )
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.argv[0]}: ports {waiting} closed after {timeout_s} s")
            try:
                with socket.create_connection(("127.0.0.1", waiting[0]), timeout=0.5):
                    waiting.pop(0)
            except OSError:
                time.sleep(0.05)

    def stop(self) -> None:
        """SIGTERM to the process group, SIGKILL after ``STOP_TIMEOUT_S``; idempotent."""
        if self.process.poll() is None:
            self._signal_group(signal.SIGTERM)
            try:
                self.process.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self._signal_group(signal.SIGKILL)
                self.process.wait()
        self._signal_group(signal.SIGKILL)  # anything it left behind in its group
        self._log.close()

    def _signal_group(self, signum: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signum)
