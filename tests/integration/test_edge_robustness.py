"""Bad input and bad clients against the real server: every finding gets its documented error,
a client that stalls or stops reading is dropped and frees its slot, and nothing is left behind
(tasks, streams, pages, WebRTC peers) or logged as a traceback."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import time
from collections.abc import Awaitable, Callable

import httpx
import pytest
import websockets
from aiortc import RTCPeerConnection
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from websockets.asyncio.client import ClientConnection

from cadenza.client.webrtc import WebRTCPeer
from tests.integration.server import RunningServer, serving

HEAD_TIMEOUT_S = 1.0
BODY_TIMEOUT_S = 1.0
SEND_TIMEOUT_S = 2.0
CONNECT_TIMEOUT_S = 2.0
MAX_PENDING_OFFERS = 3

GARBAGE = {
    "deep arrays": "[" * 5000 + "]" * 5000,
    "deep objects": '{"a":' * 3000 + "1" + "}" * 3000,
    "a 5,000-digit integer": '{"type": "ping", "data": ' + "7" * 5000 + "}",
    "a lone surrogate": '{"type": "speak", "text": "\\ud800 hello"}',
    "NaN": '{"type": "ping", "data": NaN}',
    "Infinity": '{"type": "ping", "data": [1, -Infinity]}',
}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    env = {
        "CADENZA_SERVER__REQUEST_HEAD_TIMEOUT_S": str(HEAD_TIMEOUT_S),
        "CADENZA_SERVER__REQUEST_BODY_TIMEOUT_S": str(BODY_TIMEOUT_S),
        "CADENZA_SERVER__SEND_TIMEOUT_S": str(SEND_TIMEOUT_S),
        "CADENZA_SERVER__SEND_BUFFER_BYTES": "16384",
        "CADENZA_SERVER__MAX_QUEUED_CHUNKS": "8",
        "CADENZA_SERVER__WEBRTC_CONNECT_TIMEOUT_S": str(CONNECT_TIMEOUT_S),
        "CADENZA_SERVER__MAX_PENDING_WEBRTC_OFFERS": str(MAX_PENDING_OFFERS),
    }
    with serving(tmp_path_factory.mktemp("robustness") / "server.log", env) as running:
        running.idle_tasks = running.metric("cadenza_edge_asyncio_tasks")
        yield running


def assert_nothing_left(server: RunningServer, timeout_s: float = 15.0) -> None:
    """No stream, engine request, queued request, held page, WebRTC peer or extra task; no
    traceback in the log."""
    deadline = time.monotonic() + timeout_s
    while True:
        capacity = httpx.get(f"{server.url}/v1/capacity", timeout=10).json()
        left = {
            "streams": server.metric("cadenza_streams_active"),
            "engine requests": server.metric("cadenza_engine_requests"),
            "admitted": capacity["active"],
            "queued": capacity["queued"],
            "pages held": capacity["kv_pages_total"] - capacity["kv_pages_free"],
            "webrtc peers": server.metric("cadenza_webrtc_peers"),
            "extra tasks": max(server.metric("cadenza_edge_asyncio_tasks") - server.idle_tasks, 0),
        }
        if not any(left.values()):
            break
        if time.monotonic() > deadline:
            pytest.fail(f"left behind: {left}")
        time.sleep(0.5)
    log = server.log_path.read_text()
    assert "Traceback" not in log, log[log.index("Traceback") - 2000 :][:6000]


def ws_url(server: RunningServer) -> str:
    return server.url.replace("http", "ws") + "/v1/stream"


def raw_connection(server: RunningServer, receive_buffer: int | None = None) -> socket.socket:
    sock = socket.socket()
    if receive_buffer is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
    sock.connect(("127.0.0.1", server.port))
    sock.settimeout(10)
    return sock


def read_until(sock: socket.socket, marker: bytes) -> bytes:
    """Read until `marker` arrives or the server closes: a response may come in several packets."""
    data = b""
    while marker not in data and (chunk := sock.recv(65536)):
        data += chunk
    return data


def read_until_closed(sock: socket.socket) -> bytes:
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


# -- one JSON policy for every surface --------------------------------------------------------


@pytest.mark.parametrize("garbage", list(GARBAGE.values()), ids=list(GARBAGE))
def test_garbage_json_gets_a_documented_error_on_every_surface(server, garbage) -> None:
    async def over_websocket() -> None:
        async with websockets.connect(ws_url(server), max_size=None) as ws:
            assert json.loads(await ws.recv())["type"] == "ready"
            await ws.send(garbage)
            error = json.loads(await ws.recv())
            assert (error["type"], error["code"]) == ("error", "invalid_json"), error
            await ws.send(json.dumps({"type": "ping", "data": "still here"}))
            assert json.loads(await ws.recv()) == {"type": "pong", "data": "still here"}

    asyncio.run(over_websocket())
    headers = {"Content-Type": "application/json"}
    speech = httpx.post(f"{server.url}/v1/audio/speech", content=garbage, headers=headers)
    assert speech.status_code == 400 and speech.json()["error"]["code"] == "invalid_json"
    offer = httpx.post(f"{server.url}/v1/webrtc/offer", content=garbage, headers=headers)
    assert offer.status_code == 400 and offer.json()["error"]["code"] == "invalid_offer"
    assert_nothing_left(server)


def test_a_pcm_speak_at_sample_rate_zero_is_refused(server) -> None:
    async def scenario() -> dict:
        async with websockets.connect(ws_url(server)) as ws:
            await ws.recv()
            await ws.send(json.dumps({"type": "speak", "text": "hi", "sample_rate": 0}))
            return json.loads(await ws.recv())

    error = asyncio.run(scenario())
    assert (error["type"], error["code"]) == ("error", "invalid_sample_rate")
    assert_nothing_left(server)


def test_pong_is_standard_json(server) -> None:
    def strict(text: str) -> object:
        return json.loads(text, parse_constant=lambda name: pytest.fail(f"non-JSON {name}"))

    async def scenario() -> dict:
        async with websockets.connect(ws_url(server)) as ws:
            await ws.recv()
            await ws.send(json.dumps({"type": "ping", "data": {"x": [1, 2.5e300, "é", None]}}))
            return strict(await ws.recv())  # type: ignore[return-value]

    assert asyncio.run(scenario())["data"] == {"x": [1, 2.5e300, "é", None]}


# -- frames that break the WebSocket protocol itself ------------------------------------------


def masked_frame(first_byte: int, payload: bytes) -> bytes:
    """A client frame as it goes on the wire: ``first_byte`` (FIN, reserved bits, opcode), the
    mask bit and the length (under 126), and the mask key 0, so the payload reads as it is."""
    assert len(payload) < 126
    return bytes([first_byte, 0x80 | len(payload)]) + bytes(4) + payload


def written(data: bytes) -> Callable[[ClientConnection], Awaitable[None]]:
    """Bytes written to the socket as they are, past the client library's framing."""

    async def write(ws: ClientConnection) -> None:
        ws.transport.write(data)

    return write


def sent(
    message: str | bytes | list[bytes], text: bool | None = None
) -> Callable[[ClientConnection], Awaitable[None]]:
    """A message the client library frames: bytes with ``text=True`` go in a text frame as
    they are, valid UTF-8 or not; a list is sent as fragments of one message."""

    async def send(ws: ClientConnection) -> None:
        await ws.send(message, text=text)

    return send


BAD_FRAMES = {  # what the client sends, the close code it gets, WARNING lines that name it
    "a text message that is not UTF-8": (sent(b'{"type": "ping", "data": "\xff"}', True), 1007, 1),
    "text fragments that do not join into UTF-8": (
        sent([b'{"type": "ping", "data": "\xe2\x82', b'"}'], True),
        1007,
        1,
    ),
    "a text message that is not UTF-8 and a close frame, in one write": (
        written(masked_frame(0x81, b"\xff") + masked_frame(0x88, b"\x03\xe8")),
        1000,  # the client's close came first: the server echoes it
        1,
    ),
    "a text message over server.ws_max_message_bytes": (sent("x" * 70_000), 1009, 0),
    "a close frame whose reason is not UTF-8": (
        written(masked_frame(0x88, b"\x03\xe8\xff")),
        1007,
        0,
    ),
    "a reserved opcode": (written(masked_frame(0x83, b"")), 1002, 0),
    "an unmasked frame": (written(b"\x81\x02{}"), 1002, 0),
}


def log_since(server: RunningServer, offset: int) -> list[str]:
    """The server log's lines written after ``offset`` (bytes)."""
    with server.log_path.open("rb") as log:
        log.seek(offset)
        return log.read().decode(errors="replace").splitlines()


def log_level(line: str) -> str | None:
    """The level of a server log line: the JSON lines of cadenza's loggers, or uvicorn's
    ``LEVEL:  message`` lines; ``None`` for anything else (a traceback's lines)."""
    if line.startswith("{"):
        with contextlib.suppress(ValueError):
            return str(json.loads(line).get("level"))
    head, colon, _ = line.partition(":")
    return head.lower() if colon and head.isalpha() and head.isupper() else None


def assert_logged_as_a_client_fault(lines: list[str], client: str, warnings: int) -> None:
    """Nothing at ERROR or above and no traceback, whoever logged it; ``warnings`` WARNING
    lines naming ``client`` (``host:port``)."""
    levels = [log_level(line) for line in lines]
    assert not {"error", "critical"} & set(levels), "\n".join(lines)
    assert not any("Traceback" in line for line in lines), "\n".join(lines)
    naming = [line for line in lines if log_level(line) == "warning" and client in line]
    assert len(naming) == warnings, "\n".join(lines)


def client_address(ws: ClientConnection) -> str:
    host, port = ws.local_address[:2]
    return f"{host}:{port}"


@pytest.mark.parametrize(
    "send, close_code, warnings", list(BAD_FRAMES.values()), ids=list(BAD_FRAMES)
)
def test_a_frame_that_breaks_the_protocol_closes_with_its_code_and_no_error_log(
    server, send, close_code, warnings
) -> None:
    offset = server.log_path.stat().st_size

    async def scenario() -> tuple[int, str]:
        async with websockets.connect(ws_url(server), max_size=None) as ws:
            assert json.loads(await ws.recv())["type"] == "ready"
            await send(ws)
            with pytest.raises(websockets.ConnectionClosed) as closed:
                await asyncio.wait_for(ws.recv(), 10)
            assert closed.value.rcvd is not None, "the server sent no close frame"
            return closed.value.rcvd.code, client_address(ws)

    code, client = asyncio.run(scenario())
    assert code == close_code
    assert_nothing_left(server)
    assert_logged_as_a_client_fault(log_since(server, offset), client, warnings)


def test_binary_where_json_is_expected_is_refused_and_the_session_goes_on(server) -> None:
    offset = server.log_path.stat().st_size

    async def scenario() -> tuple[dict, dict, str]:
        async with websockets.connect(ws_url(server)) as ws:
            await ws.recv()
            await ws.send(b'{"type": "ping", "data": "as bytes"}')
            error = json.loads(await ws.recv())
            await ws.send(json.dumps({"type": "ping", "data": "still here"}))
            return error, json.loads(await ws.recv()), client_address(ws)

    error, pong, client = asyncio.run(scenario())
    assert (error["type"], error["code"]) == ("error", "unexpected_binary")
    assert pong == {"type": "pong", "data": "still here"}
    assert_nothing_left(server)
    assert_logged_as_a_client_fault(log_since(server, offset), client, warnings=0)


# -- stalled and oversized requests -----------------------------------------------------------


def test_a_request_head_that_trickles_in_is_cut_off(server) -> None:
    sock = raw_connection(server)
    started = time.monotonic()
    sock.sendall(b"POST /v1/audio/speech HTTP/1.1\r\nHost: x\r\n")
    closed = False
    for _ in range(40):  # one header byte every 0.2 s would take 8 s
        try:
            sock.sendall(b"X")
        except OSError:
            closed = True
            break
        time.sleep(0.2)
        try:
            if sock.recv(1, socket.MSG_DONTWAIT | socket.MSG_PEEK) == b"":
                closed = True
                break
        except (BlockingIOError, TimeoutError):
            continue  # nothing to read: still open
        except OSError:
            closed = True
            break
    assert closed, "the trickling request head kept its connection"
    assert time.monotonic() - started < HEAD_TIMEOUT_S + 2.0
    sock.close()


def test_a_stalled_body_gets_408(server) -> None:
    sock = raw_connection(server)
    sock.sendall(
        b"POST /v1/audio/speech HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b'Content-Length: 100\r\n\r\n{"model": '
    )
    started = time.monotonic()
    response = read_until(sock, b"body_timeout")
    assert response.startswith(b"HTTP/1.1 408"), response
    assert b"body_timeout" in response
    assert time.monotonic() - started < BODY_TIMEOUT_S + 2.0
    sock.close()
    assert_nothing_left(server)


@pytest.mark.parametrize("path", ["/v1/webrtc/offer", "/v1/audio/speech"])
def test_a_huge_body_is_refused_before_it_is_read(server, path) -> None:
    sock = raw_connection(server)
    sock.sendall(
        f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        "Content-Length: 100000000\r\n\r\n".encode()
        + b"x" * 1000
    )
    response = read_until(sock, b"body_too_large")  # answered at once: 99.99 MB never sent
    assert response.startswith(b"HTTP/1.1 413"), response
    assert b"body_too_large" in response
    sock.close()
    chunked = httpx.post(
        f"{server.url}{path}",
        content=iter([b"x" * 32768] * 4),  # no Content-Length: refused past 64 KiB
        headers={"Content-Type": "application/json"},
    )
    assert chunked.status_code == 413


def test_a_client_that_hangs_up_mid_body_is_an_event_not_a_traceback(server) -> None:
    for _ in range(5):
        sock = raw_connection(server)
        sock.sendall(
            b'POST /v1/audio/speech HTTP/1.1\r\nHost: x\r\nContent-Length: 500\r\n\r\n{"mo'
        )
        time.sleep(0.1)
        sock.close()
    assert_nothing_left(server)


def test_generated_api_pages_are_not_served(server) -> None:
    for path in ("/docs", "/redoc", "/openapi.json"):
        assert httpx.get(f"{server.url}{path}").status_code == 404


# -- clients that stop reading ----------------------------------------------------------------


def test_a_websocket_client_that_stops_reading_is_dropped_and_frees_its_slot(server) -> None:
    async def scenario() -> None:
        sock = raw_connection(server, receive_buffer=4096)
        sock.setblocking(False)
        async with websockets.connect(ws_url(server), sock=sock, max_queue=1) as ws:
            await ws.recv()
            speak = {"type": "speak", "text": "x" * 2000, "sample_rate": 48000}
            await ws.send(json.dumps(speak))
            await ws.recv()  # started; from here on the client reads nothing
            deadline = time.monotonic() + 30
            while server.metric("cadenza_streams_active") == 0:
                assert time.monotonic() < deadline
                await asyncio.sleep(0.2)
            while server.metric("cadenza_streams_active") > 0:
                assert time.monotonic() < deadline, "the stalled client kept its slot"
                await asyncio.sleep(0.5)
            while server.metric("cadenza_engine_requests") > 0:  # its next stats report
                assert time.monotonic() < deadline, "the engine kept the stalled stream"
                await asyncio.sleep(0.2)
            with pytest.raises(websockets.ConnectionClosed):
                while True:  # what was buffered, then the end of the connection
                    await asyncio.wait_for(ws.recv(), 10)

    asyncio.run(scenario())
    finished = server.metric('cadenza_streams_finished_total{reason="error",transport="websocket"}')
    finished += server.metric(
        'cadenza_streams_finished_total{reason="cancelled",transport="websocket"}'
    )
    assert finished >= 1
    assert_nothing_left(server)


def test_an_http_client_that_stops_reading_is_dropped_and_frees_its_slot(server) -> None:
    sock = raw_connection(server, receive_buffer=4096)
    body = json.dumps(
        {"model": "cadenza-tiny", "input": "x" * 2000, "response_format": "pcm"}
    ).encode()
    sock.sendall(
        b"POST /v1/audio/speech HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {len(body)}\r\n\r\n".encode()
        + body
    )
    assert sock.recv(64).startswith(b"HTTP/1.1 200")  # audio flows; now stop reading
    deadline = time.monotonic() + 30
    while server.metric("cadenza_streams_active") > 0:
        assert time.monotonic() < deadline, "the stalled client kept its slot"
        time.sleep(0.5)
    sock.close()
    assert server.metric('cadenza_streams_finished_total{reason="cancelled",transport="http"}')
    assert_nothing_left(server)


# -- WebRTC peers that never connect ----------------------------------------------------------


def test_webrtc_offers_whose_peers_never_connect_are_bounded_and_cleaned_up(server) -> None:
    async def scenario() -> None:
        peers = []
        async with httpx.AsyncClient(timeout=30) as client:
            for attempt in range(MAX_PENDING_OFFERS + 1):
                pc = RTCPeerConnection()
                pc.addTransceiver("audio", direction="recvonly")
                pc.createDataChannel("control")
                await pc.setLocalDescription(await pc.createOffer())
                peers.append(pc)
                response = await client.post(
                    f"{server.url}/v1/webrtc/offer",
                    json={"sdp": pc.localDescription.sdp, "type": "offer"},
                )
                if attempt < MAX_PENDING_OFFERS:
                    assert response.status_code == 200  # answered; the answer is never applied
                else:
                    assert response.status_code == 503, response.text
                    assert response.json()["error"]["code"] == "too_many_offers"
                    assert int(response.headers["Retry-After"]) >= 1
            assert server.metric('cadenza_webrtc_peers{state="pending"}') == MAX_PENDING_OFFERS
            await asyncio.sleep(CONNECT_TIMEOUT_S + 1.0)
            assert server.metric("cadenza_webrtc_peers") == 0
        for pc in peers:
            await pc.close()

    asyncio.run(scenario())
    assert_nothing_left(server)


# -- fuzzing every transport's parser, then the leak checks -----------------------------------

CLIENT_TYPES = ["speak", "audio_in", "hello", "cancel", "ping", "close", "nope"]
FIELD_VALUES = (
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=30)
    | st.lists(st.integers(), max_size=3)
)
FIELDS = ["text", "voice", "format", "sample_rate", "max_duration_s", "seed", "priority", "data"]
message_shapes = st.builds(
    lambda kind, fields: json.dumps({"type": kind, **fields}),
    st.sampled_from(CLIENT_TYPES),
    st.dictionaries(st.sampled_from(FIELDS), FIELD_VALUES, max_size=4),
)
client_texts = message_shapes | st.text(max_size=60) | st.sampled_from(list(GARBAGE.values()))
client_frames = client_texts | st.binary(max_size=100)
FUZZ = settings(max_examples=8, deadline=None, suppress_health_check=list(HealthCheck))


@FUZZ
@given(frames=st.lists(client_frames, min_size=1, max_size=12))
def test_fuzzed_websocket_messages_leave_nothing_behind(server, frames) -> None:
    async def scenario() -> None:
        async with websockets.connect(ws_url(server), max_size=None) as ws:
            await ws.recv()
            for frame in frames:
                await ws.send(frame)
            await ws.send(json.dumps({"type": "ping", "data": "end"}))
            while True:  # every answer is standard JSON (or audio) until the pong
                message = await asyncio.wait_for(ws.recv(), 30)
                if isinstance(message, str):
                    event = json.loads(message, parse_constant=pytest.fail)
                    if event == {"type": "pong", "data": "end"}:
                        break
                    if event["type"] == "error":
                        assert event["code"] != "internal", event
                    if event["type"] == "close":
                        break

    with contextlib.suppress(websockets.ConnectionClosedOK):  # a fuzzed "close"
        asyncio.run(scenario())


@FUZZ
@given(bodies=st.lists(client_frames, min_size=1, max_size=6))
def test_fuzzed_speech_bodies_get_json_errors_never_500(server, bodies) -> None:
    for body in bodies:
        response = httpx.post(
            f"{server.url}/v1/audio/speech",
            content=body.encode("utf-8", "surrogatepass") if isinstance(body, str) else body,
            headers={"Content-Type": "application/json"},
            timeout=60,
        )
        assert response.status_code in (200, 400, 404, 413, 429, 503), response.text
        if response.status_code != 200:
            assert response.json()["error"]["code"]


offer_bodies = client_frames | st.builds(
    lambda sdp, kind: json.dumps({"sdp": sdp, "type": kind}),
    st.text(max_size=80) | st.just("v=0\r\n"),
    st.sampled_from(["offer", "answer", 1]),
)


@FUZZ
@given(bodies=st.lists(offer_bodies, min_size=1, max_size=6))
def test_fuzzed_offers_get_json_errors_never_500(server, bodies) -> None:
    for body in bodies:
        response = httpx.post(
            f"{server.url}/v1/webrtc/offer",
            content=body.encode("utf-8", "surrogatepass") if isinstance(body, str) else body,
            headers={"Content-Type": "application/json"},
            timeout=60,
        )
        assert response.status_code in (400, 413, 503), response.text
        assert response.json()["error"]["code"] in (
            "invalid_offer",
            "invalid_sdp",
            "body_too_large",
            "too_many_offers",
        )


@settings(max_examples=3, deadline=None, suppress_health_check=list(HealthCheck))
@given(frames=st.lists(client_frames, min_size=1, max_size=15))
def test_fuzzed_data_channel_messages_leave_nothing_behind(server, frames) -> None:
    async def scenario() -> None:
        peer = WebRTCPeer(server.url)
        try:
            await peer.connect()
            for frame in frames:
                peer.channel.send(frame)
            peer.send({"type": "ping", "data": "end"})
            try:
                while (await peer.next_event({"pong", "error", "done"}, 15))["type"] != "pong":
                    pass
            except TimeoutError:  # only a fuzzed "close" may end the session
                assert '{"type": "close"}' in frames, frames
        finally:
            await peer.close()

    asyncio.run(scenario())


def test_after_the_fuzzing_nothing_is_left_behind(server) -> None:
    assert_nothing_left(server, timeout_s=40.0)
