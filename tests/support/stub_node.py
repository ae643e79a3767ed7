"""Stand-ins for a cadenza node, for testing what sits in front of nodes (HAProxy): an HTTP
server in threads that answers like a node's routes without an engine, and the node's load
agent (a TCP port answering one line per connection, as HAProxy's ``agent-check`` reads it).

``StubNode``: ``GET /readyz`` answers 200; a ``GET`` with ``Upgrade: websocket`` answers 101
and echoes what the client sends next; any other request answers 200 with ``<name> <body>``
(the body echoed), or, while ``refusals`` is positive, 503 ``queue_full`` with ``Retry-After``
(a refusal for capacity, sent before anything else, as the node sends it). Every request
except the health checks is recorded in ``served`` or ``refused``.
"""

from __future__ import annotations

import base64
import hashlib
import json
import socketserver
import sys
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

_WEBSOCKET_GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"  # RFC 6455, section 1.3


class _IgnoresHangups(socketserver.BaseServer):
    """A peer that hangs up mid-answer is expected here (HAProxy drops a refused response
    as soon as it has read its status line): not an error to print."""

    def handle_error(self, request: object, client_address: object) -> None:
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)  # type: ignore[arg-type]


class _HTTPServer(_IgnoresHangups, ThreadingHTTPServer):
    daemon_threads = True


class _TCPServer(_IgnoresHangups, socketserver.ThreadingTCPServer):
    daemon_threads = True


@dataclass(frozen=True)
class SeenRequest:
    method: str
    path: str
    body: bytes
    headers: dict[str, str] = field(default_factory=dict)

    @property
    def test_id(self) -> str | None:
        return self.headers.get("x-test-id")


class StubNode:
    def __init__(self, name: str) -> None:
        self.name = name
        self.refusals = 0
        self.served: list[SeenRequest] = []
        self.refused: list[SeenRequest] = []
        self._lock = threading.Lock()
        self._server = _HTTPServer(("127.0.0.1", 0), _handler_for(self))
        self.port = int(self._server.server_address[1])
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def refuse_next(self, count: int) -> None:
        with self._lock:
            self.refusals = count

    def forget(self) -> None:
        with self._lock:
            self.served.clear()
            self.refused.clear()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _take(self, seen: SeenRequest) -> bool:
        """Record ``seen``; True when it is to be refused."""
        with self._lock:
            refuse = self.refusals > 0
            self.refusals -= refuse
            (self.refused if refuse else self.served).append(seen)
            return refuse


def _handler_for(node: StubNode) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            self._answer()

        def do_POST(self) -> None:
            self._answer()

        def log_message(self, format: str, *args: object) -> None:
            pass

        def _answer(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if self.path == "/readyz":
                self._send(200, b'{"status": "ready"}')
                return
            headers = {key.lower(): value for key, value in self.headers.items()}
            if node._take(SeenRequest(self.command, self.path, body, headers)):
                refusal = {"error": {"code": "queue_full", "message": f"{node.name} is full"}}
                self._send(503, json.dumps(refusal).encode(), {"Retry-After": "1"})
            elif headers.get("upgrade", "").lower() == "websocket":
                self._echo_once()
            else:
                self._send(200, node.name.encode() + b" " + body)

        def _send(self, status: int, body: bytes, headers: dict[str, str] | None = None) -> None:
            self.send_response(status)
            for key, value in {"Content-Length": str(len(body)), **(headers or {})}.items():
                self.send_header(key, value)
            self.end_headers()
            self.wfile.write(body)

        def _echo_once(self) -> None:
            """Switch protocols, echo the first bytes the client sends, close."""
            key = self.headers.get("Sec-WebSocket-Key", "") + _WEBSOCKET_GUID
            accept = base64.b64encode(hashlib.sha1(key.encode()).digest()).decode()
            self.send_response(101)
            self.send_header("Upgrade", "websocket")
            self.send_header("Connection", "Upgrade")
            self.send_header("Sec-WebSocket-Accept", accept)  # HAProxy checks it
            self.end_headers()
            self.wfile.flush()
            self.connection.settimeout(5)
            data = self.rfile.read1(4096)
            self.wfile.write(node.name.encode() + b" " + data)
            self.close_connection = True

    return Handler


class StubAgent:
    """A node's load agent: each connection gets ``reply`` and a newline, then is closed.
    ``polls`` counts the connections (HAProxy asks every ``agent-inter``)."""

    def __init__(self, reply: str = "up 100%") -> None:
        self.reply = reply
        self.polls = 0
        self._polled = threading.Condition()
        agent = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                self.request.sendall(agent.reply.encode() + b"\n")
                with agent._polled:
                    agent.polls += 1
                    agent._polled.notify_all()

        self._server = _TCPServer(("127.0.0.1", 0), Handler)
        self.port = int(self._server.server_address[1])
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def answer(self, reply: str, *, polls: int = 2, timeout_s: float = 10.0) -> None:
        """Answer ``reply`` from now on, and return once HAProxy has read it ``polls`` times
        (so that it has acted on it). Raises ``TimeoutError``."""
        with self._polled:
            self.reply = reply
            target = self.polls + polls
            if not self._polled.wait_for(lambda: self.polls >= target, timeout=timeout_s):
                raise TimeoutError(f"agent polled {self.polls} times, waited for {target}")
        time.sleep(0.05)  # HAProxy applies the line just after reading it

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
