"""The test fixtures that run real infrastructure (tests/support/haproxy_process.py,
tests/support/redis_process.py) start it ready to use and leave nothing behind."""

from __future__ import annotations

import http.client
import socket

import pytest

from tests.support.haproxy_process import running_haproxy
from tests.support.ports import free_port
from tests.support.redis_process import running_redis


def _refused(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) != 0


def _stats_only(port: int) -> str:
    return (
        "defaults\n    mode http\n    timeout connect 1s\n    timeout client 5s\n"
        f"    timeout server 5s\n\nfrontend stats\n    bind 127.0.0.1:{port}\n"
        "    stats enable\n    stats uri /\n"
    )


def test_the_haproxy_fixture_starts_it_ready(haproxy):
    port = free_port()
    haproxy(_stats_only(port), [port])
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    connection.request("GET", "/;csv")
    assert connection.getresponse().status == 200
    connection.close()


def test_haproxy_is_stopped_after_the_block(tmp_path):
    port = free_port()
    with running_haproxy(_stats_only(port), tmp_path, [port]) as process:
        assert process.process.poll() is None
    assert process.process.poll() is not None
    assert _refused(port)


def test_a_config_haproxy_cannot_run_is_an_error_with_its_log(tmp_path):
    with pytest.raises(RuntimeError, match="exited"), running_haproxy("nonsense\n", tmp_path, [1]):
        pass


def test_the_redis_fixture_starts_it_ready_and_empty(redis_server):
    with socket.create_connection(("127.0.0.1", redis_server.port), timeout=5) as sock:
        sock.sendall(b"SET greeting hello\r\nGET greeting\r\nDBSIZE\r\n")
        replies = b""
        while replies.count(b"\r\n") < 4:
            replies += sock.recv(1024)
    assert replies == b"+OK\r\n$5\r\nhello\r\n:1\r\n"
    assert redis_server.url == f"redis://127.0.0.1:{redis_server.port}/0"


def test_redis_is_stopped_after_the_block_and_persists_nothing(tmp_path):
    with running_redis(tmp_path) as server:
        assert server.ping()
    assert server.process.process.poll() is not None
    assert _refused(server.port)
    assert sorted(path.name for path in tmp_path.iterdir()) == [f"redis-{server.port}.log"]
