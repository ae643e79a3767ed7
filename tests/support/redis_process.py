"""Redis for a test: ``redis-server`` on a free loopback port, nothing persisted (no RDB
snapshots, no append-only file), optionally behind a password, ready once it answers ``PING``,
stopped at the end.

Skips the test when ``redis-server`` is missing (``make infra`` installs it). The fixture
``redis_server`` gives a running one per test; a module that shares one uses
:func:`running_redis` in a module fixture.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.background_process import BackgroundProcess, require_binary
from tests.support.ports import free_port


@dataclass(frozen=True)
class RedisServer:
    port: int
    process: BackgroundProcess
    password: str | None = None  # what AUTH takes (requirepass); None: none needed

    @property
    def url(self) -> str:
        user = "" if self.password is None else f":{self.password}@"
        return f"redis://{user}127.0.0.1:{self.port}/0"

    def ping(self, timeout_s: float = 1.0) -> bool:
        """True when the server answers ``PING`` with ``+PONG`` (RESP, no client library)."""
        auth = b"" if self.password is None else f"AUTH {self.password}\r\n".encode()
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=timeout_s) as sock:
                sock.sendall(auth + b"PING\r\n")
                answer = b""
                while answer.count(b"\r\n") < (2 if auth else 1):
                    received = sock.recv(64)
                    if not received:
                        break
                    answer += received
                return answer.split(b"\r\n")[-2].startswith(b"+PONG")
        except (OSError, IndexError):
            return False


@contextmanager
def running_redis(
    directory: Path, timeout_s: float = 10.0, port: int | None = None, password: str | None = None
) -> Iterator[RedisServer]:
    """A ready Redis until the block ends (on ``port``, e.g. a stopped one's to bring it back
    where its clients look; default a free one; ``password``: clients must give it, and its
    ``url`` carries it); its log is ``directory/redis-PORT.log``."""
    port = port or free_port()
    argv = [
        require_binary("redis-server", "redis-server"),
        "--port", str(port),
        "--bind", "127.0.0.1",
        "--save", "",
        "--appendonly", "no",
        "--dir", str(directory),
        *(() if password is None else ("--requirepass", password)),
    ]  # fmt: skip
    process = BackgroundProcess(argv, directory / f"redis-{port}.log")
    try:
        process.wait_listening([port], timeout_s)
        server = RedisServer(port, process, password)
        deadline = time.monotonic() + timeout_s
        while not server.ping():
            if time.monotonic() > deadline:
                raise RuntimeError(f"redis-server does not answer PING:\n{process.log()}")
            time.sleep(0.05)
        yield server
    finally:
        process.stop()


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    with running_redis(tmp_path) as server:
        yield server
