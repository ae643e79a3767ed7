"""A real TURN relay (Debian's ``coturn``) on loopback, for a test: credentials that expire,
checked against the shared secret ``SECRET`` (``use-auth-secret`` with ``static-auth-secret``,
the scheme cadenza/edge/transports/turn_credentials.py computes) in realm ``cadenza``, relaying
between loopback peers, UDP only. ``make test`` installs it; tests skip with the reason where
it is missing."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest

SECRET = "relay-secret-shared-with-cadenza"


def _free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class TurnRelay:
    def __init__(self, workdir: Path) -> None:
        binary = shutil.which("turnserver")
        if binary is None:
            pytest.skip("turnserver (coturn) is not installed (make infra installs it)")
        self.port = _free_udp_port()
        self.url = f"turn:127.0.0.1:{self.port}"
        self.log_path = workdir / "turnserver.log"
        relay_low = 40_000 + (self.port % 20_000)
        command = [
            binary, "-n", "--no-cli", "--no-tls", "--no-dtls", "--allow-loopback-peers",
            "--listening-ip=127.0.0.1", "--relay-ip=127.0.0.1", f"--listening-port={self.port}",
            f"--min-port={relay_low}", f"--max-port={relay_low + 200}", "--use-auth-secret",
            f"--static-auth-secret={SECRET}", "--realm=cadenza", f"--log-file={self.log_path}",
            "--simple-log", "--no-stdout-log", "--verbose",
            f"--pidfile={workdir / 'turnserver.pid'}",
        ]  # fmt: skip
        self.process = subprocess.Popen(
            command, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT
        )
        self._wait_listening()

    def _wait_listening(self) -> None:
        """Until a STUN binding request on the port gets an answer."""
        request = bytes.fromhex("0001 0000 2112a442") + b"cadenza-test"
        deadline = time.monotonic() + 10
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            sock.settimeout(0.2)
            while time.monotonic() < deadline:
                if self.process.poll() is not None:
                    break
                sock.sendto(request, ("127.0.0.1", self.port))
                try:
                    if sock.recvfrom(512)[0][:2] == b"\x01\x01":
                        return
                except TimeoutError:
                    continue
        raise RuntimeError(f"turnserver did not start on port {self.port}")

    def log(self) -> str:
        return self.log_path.read_text() if self.log_path.exists() else ""

    def allocations(self) -> int:
        """Relay allocations the server logged as made (what a relayed peer needs)."""
        return self.log().count("ALLOCATE processed, success")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
