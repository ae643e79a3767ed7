"""HAProxy's agent check: a line per connection that tells the front door how much of this node
is free (``cadenza serve --agent-port PORT``; docs/scaling.md).

HAProxy connects to the agent port every ``agent-inter``, reads one line and closes. The line
is what :func:`agent_reply` makes of the node now:

* ``down`` while some served model has no engine replica ready (``/readyz`` is 503 then too);
* ``drain`` while the node drains (SIGTERM, ``POST /admin/drain``) or no served model admits new
  streams (every replica's admission closed for slipping deadlines): HAProxy sends it no new
  requests and leaves the open streams alone;
* ``up ready N%`` otherwise, ``N`` the node's free real-time headroom: the nominal streams it would
  still admit (its claim, within ``admission.max_streams``, less the streams active and
  queued, and less the streams reserved for WebSocket sessions accepted but not yet speaking,
  :mod:`~cadenza.edge.admission.session_reservations`) as a percentage of its claim, over
  every served model. HAProxy scales the server's configured weight by it, so new streams go
  where there is room. A full node says ``up 1%``,
  never 0: while every node is full, requests still reach one, which queues or refuses them
  with cadenza's own documented 503 (and its ``Retry-After``) instead of HAProxy's bare one.
  ``ready`` is there because in HAProxy only that word ends a ``drain`` the agent said
  before: a node back from a drain (a rolling restart) takes new streams again.

HAProxy sends nothing unless ``agent-send`` is configured; the agent takes no query. A peer
that sends anything gets the same line with a description after ``#`` saying the input was
ignored (HAProxy shows it as the check's description), and the input is logged once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from cadenza.edge.admission.capacity_snapshot import CapacitySnapshot
from cadenza.edge.server.node_headroom import claimed_streams, free_streams

log = logging.getLogger(__name__)

INPUT_WAIT_S = 0.05  # how long a connection may send something before the line goes out
MAX_INPUT_BYTES = 256
_IO_TIMEOUT_S = 2.0


@dataclass(frozen=True)
class NodeState:
    """What the agent reads of the node: whether it drains, whether every served model has a
    ready replica, each model's capacity snapshot, and the streams reserved for WebSocket
    sessions that have not reached admission yet."""

    draining: bool
    ready: bool
    snapshots: Sequence[CapacitySnapshot]
    reserved: int = 0


def free_percent(snapshots: Sequence[CapacitySnapshot], reserved: int = 0) -> int:
    """The node's free real-time headroom in percent of its claim (0-100), over every model:
    streams it would still admit (:func:`~.node_headroom.free_streams`) less those
    ``reserved``, over the streams it claims."""
    claimed = claimed_streams(snapshots)
    if claimed <= 0:
        return 0
    free = max(free_streams(snapshots) - reserved, 0)
    return min(100, math.floor(100 * free / claimed))


def agent_reply(node: NodeState) -> str:
    """The agent's line for ``node`` (without its newline): ``down``, ``drain`` or
    ``up ready N%`` with ``1 <= N <= 100`` (see the module's docstring)."""
    if not node.ready:
        return "down"
    if node.draining or not any(s.admission_open for s in node.snapshots):
        return "drain"
    return f"up ready {max(free_percent(node.snapshots, node.reserved), 1)}%"


def with_ignored_input(reply: str, received: bytes) -> str:
    """``reply`` with a description saying the agent ignored ``received`` (shown by HAProxy)."""
    shown = received[:32].decode("ascii", "backslashreplace").strip()
    return f"{reply} # ignored input {shown!r}: the agent takes no query (remove agent-send)"


class AgentCheckServer:
    """The agent on ``host:port`` (``port`` 0: a free one, see :attr:`port`), answering each
    connection with :func:`agent_reply` of ``node()``."""

    def __init__(self, host: str, port: int, node: Callable[[], NodeState]) -> None:
        self.host = host
        self.requested_port = port
        self.node = node
        self.port = 0
        self._server: asyncio.Server | None = None
        self._inputs_logged: set[bytes] = set()

    async def start(self) -> None:
        """Listen; raises ``OSError`` naming the address when the port cannot be bound."""
        try:
            self._server = await asyncio.start_server(self._answer, self.host, self.requested_port)
        except OSError as exc:
            raise OSError(
                exc.errno,
                f"agent port {self.host}:{self.requested_port} cannot be bound: {exc.strerror}",
            ) from exc
        self.port = self._server.sockets[0].getsockname()[1]
        log.info("HAProxy agent check on %s:%d", self.host, self.port)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None

    async def _answer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            received = b""
            with contextlib.suppress(TimeoutError):
                received = await asyncio.wait_for(reader.read(MAX_INPUT_BYTES), INPUT_WAIT_S)
            reply = agent_reply(self.node())
            if received.strip():
                reply = with_ignored_input(reply, received)
                if received not in self._inputs_logged and len(self._inputs_logged) < 16:
                    self._inputs_logged.add(received)
                    log.warning("agent check: %s", reply.partition("# ")[2])
            writer.write(f"{reply}\n".encode("ascii"))
            await asyncio.wait_for(writer.drain(), _IO_TIMEOUT_S)
        except (ConnectionError, TimeoutError):
            pass  # the checker left; the next check asks again
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError, TimeoutError):
                await asyncio.wait_for(writer.wait_closed(), _IO_TIMEOUT_S)
