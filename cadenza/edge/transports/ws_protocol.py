"""The WebSocket server protocol: uvicorn's, on the ``websockets`` sans-I/O core, with a text
message that is not UTF-8 treated as what it is, a client's fault.

RFC 6455 (section 8.1) says a text message that is not UTF-8 fails the connection, and uvicorn
does that: it closes with 1007 (invalid frame payload data). But it decodes the message only
when handing it to the app and logs the ``UnicodeDecodeError`` at ERROR with a traceback, as if
the server had failed, so any client could fill the log with tracebacks. Here each text
message is checked first: one WARNING line, then the same 1007 close, and the app sees the
disconnect as it sees any other.

Every other frame that breaks the protocol (a reserved opcode or bit, an unmasked frame, a
close frame with a bad code or a reason that is not UTF-8, a message over
``server.ws_max_message_bytes``) fails in the ``websockets`` parser, which closes with 1002,
1007 or 1009 and logs nothing above DEBUG.
"""

from __future__ import annotations

import logging

from uvicorn.protocols.utils import get_client_addr
from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol
from websockets.frames import CloseCode
from websockets.protocol import State

log = logging.getLogger(__name__)


class Utf8CheckedWebSocketProtocol(WebSocketsSansIOProtocol):
    def send_receive_event_to_app(self) -> None:
        """A complete message arrived (its frames in ``self.frames``): a text message that is
        not UTF-8 closes the connection with 1007; anything else goes to uvicorn as it is."""
        if self.curr_msg_data_type != "text" or self.close_sent or _is_utf8(self.frames):
            super().send_receive_event_to_app()
            return
        self.frames = []
        log.warning(
            "closing a WebSocket from %s with 1007: it sent a text message that is not UTF-8",
            get_client_addr(self.scope) or "?",
        )
        if self.conn.state is State.OPEN:  # else its close frame came with it: that ends it
            self.conn.send_close(CloseCode.INVALID_DATA, "text message is not UTF-8")
            self.handle_parser_exception()  # uvicorn's way out: disconnect the app, send, close


def _is_utf8(frames: list[bytes]) -> bool:
    try:
        b"".join(frames).decode()
    except UnicodeDecodeError:
        return False
    return True
