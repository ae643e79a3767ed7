"""A free TCP port on loopback, for a process a test starts (the port is released before the
process binds it: another process could take it meanwhile, which tests accept)."""

from __future__ import annotations

import socket


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
