"""``WS /v1/stream``: the I/O around a :class:`SpeakSession`, protocol version 1
(docs/protocol.md).

A node that drains or has no ready engine refuses the upgrade with HTTP 503 (a front door
retries it elsewhere). So does a node that could not start one more stream at once, when the
client asks it to (``X-Cadenza-Spill: 1``: 503 ``at_capacity``, and the front door places the
session on another node); a session it accepts while it has room holds a reservation
(:mod:`cadenza.edge.admission.session_reservations`) until its first utterance reaches
admission, so that a burst of upgrades does not all count the same free slot.

After the handshake and authentication the server sends ``ready``; each client message goes
through the session's rules, and each utterance the session starts plays as a task: admission
lease, ``started``, binary audio frames, ``done``. Bad messages get an ``error`` and the
session goes on.

With stream checkpoints (``limits.redis_url``, :mod:`cadenza.edge.streams.checkpoints`) each
``started`` carries a ``resume_token``, and a ``resume`` message goes on with a stream whose
connection or node was lost: the checkpoint is claimed, the stream admitted ahead of new ones,
and its audio continues from what the client says it heard.

Timeouts keep hung clients from holding anything: a session that sends nothing while nothing
plays is closed after ``server.ws_idle_timeout_s``; a client that stops reading is dropped with
``slow_consumer`` (close 4001) once a send has waited ``server.send_timeout_s``, or as soon as
its queue of ``server.max_queued_chunks`` undelivered chunks fills. Its stream's slot is freed
first, before the server tries to tell it anything.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
import uuid
from collections.abc import Awaitable, Callable

from fastapi import APIRouter, WebSocket, WebSocketDisconnect

from cadenza.contract.engine_info import EngineInfo
from cadenza.contract.errors import EngineError
from cadenza.contract.request import FinishReason
from cadenza.edge.admission.session_reservations import Reservation
from cadenza.edge.auth.api_keys import bearer_token
from cadenza.edge.auth.principal import Principal
from cadenza.edge.server.state import EdgeState
from cadenza.edge.streams import protocol
from cadenza.edge.streams.conversation import SaidFrames
from cadenza.edge.streams.errors import EdgeError, error_response
from cadenza.edge.streams.protocol import Hello, ProtocolError
from cadenza.edge.streams.resume_token import new_token
from cadenza.edge.streams.session_credential import renewed
from cadenza.edge.streams.speak_session import (
    CloseConnection,
    Event,
    FeedText,
    Renew,
    ResumeUtterance,
    Send,
    SpeakSession,
    StartUtterance,
    StopUtterance,
)
from cadenza.edge.streams.stream_resume import Resumed, claim_and_admit
from cadenza.edge.streams.text_stream import (
    SegmentStarted,
    TextStream,
    WaitingForText,
    feed_text,
    segment_message,
)
from cadenza.edge.streams.utterance_opening import OpenedUtterance, open_utterance
from cadenza.edge.streams.utterance_tasks import UtteranceTasks
from cadenza.edge.transports.listener_estimate import ListenerEstimate
from cadenza.edge.transports.ws_payloads import payload_encoder

log = logging.getLogger(__name__)

router = APIRouter()

# WebSocket close codes (RFC 6455 and the private range).
CLOSE_UNAVAILABLE = 1013
CLOSE_SLOW_CONSUMER = 4001
CLOSE_UNAUTHORIZED = 4003
HELLO_TIMEOUT_S = 10.0
GOODBYE_TIMEOUT_S = 1.0  # a client being dropped gets this long to take its last messages


@router.websocket("/v1/stream")
async def stream_endpoint(websocket: WebSocket) -> None:
    state: EdgeState = websocket.app.state.edge
    await WebSocketEndpoint(websocket, state).run()


class _ClientGone(Exception):
    """The client disconnected, or was dropped for not reading."""


class _SlowConsumer(_ClientGone):
    """A send waited ``server.send_timeout_s``: the client is to be dropped, once whatever
    stream was sending has released its slot."""


class WebSocketEndpoint:
    def __init__(self, websocket: WebSocket, state: EdgeState) -> None:
        self.websocket = websocket
        self.state = state
        self.config = state.config.server
        self.principal: Principal | None = None  # who is asking, set by _authenticate
        self._send_lock = asyncio.Lock()
        self._playing = UtteranceTasks()
        self._wake = asyncio.Event()  # an utterance ended, or the client was dropped
        self._dropped = False
        self._text_streams: dict[int, TextStream] = {}  # by stream id, while they play
        self._reservation: Reservation | None = None  # until the first utterance is admitted

    async def run(self) -> None:
        try:
            self.state.lifecycle.check_open()
            info = self.state.default.require_ready()
            spill = _wants_spill(self.websocket.headers.get(protocol.SPILL_HEADER))
            self._reservation = self.state.reserve_session(spill)
        except (EngineError, EdgeError) as exc:
            await self._deny(exc if isinstance(exc, EdgeError) else EdgeError.from_engine(exc))
            return
        try:
            await self._serve(info)
        finally:
            self._release_reservation()

    async def _serve(self, info: EngineInfo) -> None:
        await self.websocket.accept()
        if not await self._authenticate():
            return
        session = SpeakSession(
            check_speak=lambda speak: protocol.resolve_sample_rate(
                speak,
                self.state.native_rate(speak.model, info),
                self.state.codes_as_ids(speak.model, info),
            ),
            codec_rate=lambda speak: self.state.native_rate(speak.model, info),
            max_prompt_audio_s=self.state.config.limits.max_prompt_audio_s,
            max_context_s=self.state.config.limits.max_context_s,
            binary_audio=True,
            idle_timeout_s=self.config.ws_idle_timeout_s,
            max_message_chars=self.state.config.limits.max_input_chars,
            max_text_stream_chars=self.state.config.text_stream.max_chars,
        )
        try:
            await self._send_text(_ready_message(info, self.state))
            await self._receive_loop(session)
        except _SlowConsumer:
            with contextlib.suppress(_ClientGone):
                await self._drop("slow_consumer", "client is not reading fast enough")
        except (WebSocketDisconnect, _ClientGone):
            pass
        finally:
            await self._playing.stop_all()

    async def _deny(self, error: EdgeError) -> None:
        """Refuse the upgrade itself with the HTTP error (503 ``shutting_down``,
        ``engine_unavailable`` or ``at_capacity``, with ``Retry-After``; 400
        ``invalid_header``): a front door retries a 503 on another node, as it does an HTTP
        request, and the client never holds a socket this node cannot serve. A server without
        the denial extension accepts, says why and closes with 1013."""
        if "websocket.http.response" in self.websocket.scope.get("extensions", {}):
            await self.websocket.send_denial_response(error_response(error))
            return
        await self.websocket.accept()
        await self._goodbye(CLOSE_UNAVAILABLE, error.code, error.message, error.retry_after_s)

    async def _authenticate(self) -> bool:
        """A valid ``Authorization: Bearer`` header (a key or a client token), or (with no
        header at all, as a browser must) a ``hello`` with one as the first message, within
        10 s; on an open server neither is needed, and a token given still binds its scope.
        A refusal is told with its code (``invalid_api_key``, ``invalid_token``,
        ``token_expired``, ``origin_not_allowed``, ``too_many_auth_failures``) and closes
        with 1008."""
        header = self.websocket.headers.get("authorization")
        peer = self.websocket.client.host if self.websocket.client else None
        origin = self.websocket.headers.get("origin")
        credential = bearer_token(header)
        if credential is None and header is None and not self.state.auth.is_open:
            with contextlib.suppress(TimeoutError, ProtocolError):
                async with asyncio.timeout(HELLO_TIMEOUT_S):
                    message = await self.websocket.receive()
                if message["type"] == "websocket.disconnect":
                    return False
                hello = protocol.parse_client_message(message.get("text") or "")
                if isinstance(hello, Hello):
                    credential = hello.api_key
        try:
            self.principal = self.state.auth.principal(credential, peer, origin)
        except EdgeError as exc:
            await self._goodbye(CLOSE_UNAUTHORIZED, exc.code, exc.message, exc.retry_after_s)
            return False
        return True

    @property
    def _authenticated(self) -> Principal:
        """Who the session is, once :meth:`_authenticate` has passed."""
        if self.principal is None:
            raise RuntimeError("the session is used before it is authenticated")
        return self.principal

    def _release_reservation(self) -> None:
        """The session's first utterance reached admission (admitted, queued or refused), or
        the session ends: admission counts it from now on, not the reservation."""
        self.state.reservations.release(self._reservation)
        self._reservation = None

    async def _receive_loop(self, session: SpeakSession) -> None:
        receiving = asyncio.ensure_future(self.websocket.receive())
        try:
            while True:
                limit = session.idle_timeout_s()
                self._wake.clear()
                woken = asyncio.ensure_future(self._wake.wait())
                try:
                    done, _ = await asyncio.wait(
                        {receiving, woken}, timeout=limit, return_when=asyncio.FIRST_COMPLETED
                    )
                finally:
                    woken.cancel()
                if self._dropped:
                    return
                if receiving in done:
                    message = receiving.result()
                    if message["type"] == "websocket.disconnect":
                        return
                    receiving = asyncio.ensure_future(self.websocket.receive())
                    if message.get("bytes") is not None:
                        events = session.receive_bytes(message["bytes"])
                    else:
                        events = session.receive_text(message.get("text") or "")
                elif woken in done:
                    continue  # an utterance ended: the idle clock starts now
                else:
                    events = session.timed_out()
                if await self._execute(events, session):
                    return
        finally:
            receiving.cancel()
            with contextlib.suppress(asyncio.CancelledError, WebSocketDisconnect, RuntimeError):
                await receiving

    async def _execute(self, events: list[Event], session: SpeakSession) -> bool:
        """Carry out the session's events in order; ``True`` once the connection is closed."""
        for event in events:
            if isinstance(event, Send):
                await self._send_text(event.text)
            elif isinstance(event, StartUtterance | ResumeUtterance):
                self._playing.start(event.stream_id, self._play(event, session))
            elif isinstance(event, FeedText):
                feed_text(self._text_streams.get(event.stream_id), event)
            elif isinstance(event, StopUtterance):
                await self._playing.stop(event.stream_id)
            elif isinstance(event, CloseConnection):
                with contextlib.suppress(Exception):
                    async with asyncio.timeout(GOODBYE_TIMEOUT_S):
                        await self.websocket.close(event.code)
                return True
            elif isinstance(event, Renew):
                peer = self.websocket.client.host if self.websocket.client else None
                origin = self.websocket.headers.get("origin")
                self.principal, answer = renewed(
                    self.state.auth, self._authenticated, event.credential, peer, origin
                )
                await self._send_text(answer)
        return False

    async def _play(self, start: StartUtterance | ResumeUtterance, session: SpeakSession) -> None:
        stream_id = start.stream_id
        said = SaidFrames()
        try:
            if isinstance(start, StartUtterance):
                await self._play_utterance(start, said)
            else:
                await self._resume_utterance(start, said)
        except _SlowConsumer:  # its lease is closed by now: the slot is free
            with contextlib.suppress(_ClientGone):
                await self._drop("slow_consumer", "client is not reading fast enough", stream_id)
        except _ClientGone:
            pass
        finally:
            events = session.utterance_ended(stream_id, said)
            with contextlib.suppress(_ClientGone, _SlowConsumer):
                for event in events:
                    if isinstance(event, Send):
                        await self._send_text(event.text)
            self._wake.set()

    async def _play_utterance(self, start: StartUtterance, said: SaidFrames) -> None:
        stream_id = start.stream_id

        async def queued(position: int, wait_s: float) -> None:
            self._release_reservation()  # admission counts it as queued
            await self._send_text(protocol.queued_message(stream_id, position, wait_s))

        try:
            try:
                opened = await open_utterance(
                    self.state,
                    start,
                    self._authenticated,
                    "websocket",
                    audio_format=start.speak.format,
                    on_queued=queued,
                    on_text_stream=functools.partial(self._text_streams.__setitem__, stream_id),
                )
            except EdgeError as exc:
                self._release_reservation()
                await self._send_error(exc, stream_id)
                return
            self._release_reservation()
            await self._stream(stream_id, opened, said, Resumed.fresh())
        finally:
            self._text_streams.pop(stream_id, None)

    async def _resume_utterance(self, start: ResumeUtterance, said: SaidFrames) -> None:
        """Claim the checkpoint ``start`` names and go on with its stream here (see
        :mod:`cadenza.edge.streams.stream_resume`); an ``error`` when that cannot be done."""
        try:
            claimed = await claim_and_admit(
                self.state, start.resume, self._authenticated, "websocket"
            )
        except EdgeError as exc:
            self._release_reservation()
            await self._send_error(exc, start.stream_id)
            return
        self._release_reservation()
        opened = OpenedUtterance(claimed.info, claimed.lease, claimed.head, None)
        await self._stream(start.stream_id, opened, said, claimed.resumed)

    async def _stream(
        self, stream_id: int, opened: OpenedUtterance, said: SaidFrames, resumed: Resumed
    ) -> None:
        """Send the lease's audio as utterance ``stream_id`` (``started``, binary frames,
        ``done``), writing its checkpoint as it goes when the server keeps them; a text
        stream's (``text``) segment by segment, each announced with ``segment``."""
        lease, info, head, text = opened.lease, opened.info, opened.head, opened.text
        said.frame_rate = info.frame_rate
        encode = payload_encoder(head.format, info.sample_rate, head.sample_rate, info.frame_rate)
        listener = ListenerEstimate()
        checkpoint, token = None, None
        if self.state.checkpoints is not None and text is None:
            token = new_token()
            checkpoint = self.state.checkpoints.begin(token, head, resumed.rows, resumed.at)
        finished = False
        try:
            started_fields: dict[str, object] = {
                "stream_id": stream_id,
                "format": head.format,
                "sample_rate": head.sample_rate,
                "queued_s": round(lease.queued_s, 3),
            }
            if token is not None:
                started_fields["resume_token"] = token
            if resumed.rows is not None:
                started_fields["resumed"] = True
            if text is not None:
                started_fields["text_stream"] = True
            await self._send_text(protocol.server_message("started", **started_fields))
            started = time.perf_counter()
            items = lease.outputs() if text is None else text.play(lease, self._authenticated)
            async with contextlib.aclosing(items) as outputs:
                async for output in outputs:
                    if isinstance(output, SegmentStarted):
                        listener.segment_started(time.perf_counter() - started)
                        said.text = text.spoken_text if text else None
                        await self._send_text(segment_message(stream_id, output))
                        continue
                    if isinstance(output, WaitingForText):
                        listener.waiting_for_text()
                        continue
                    said.add(output)
                    if checkpoint is not None:
                        checkpoint.record(output)
                    output, resumed = resumed.pass_on(output, self.state.metrics)
                    for payload, seconds in encode(output, output.finished):
                        frame = protocol.encode_audio_frame(stream_id, listener.chunks, payload)
                        await self._send_bytes(frame)
                        listener.sent(seconds, time.perf_counter() - started)
                    if output.finished:
                        reason = output.finish_reason.value if output.finish_reason else "eos"
                        if text is not None and output.finish_reason is FinishReason.EOS:
                            reason = text.end_reason
                        await self._send_text(listener.done_message(stream_id, reason))
                        finished = True
        except EdgeError as exc:
            lease.close()  # free the slot before telling the client anything
            finished = True  # the stream failed here: nothing to resume
            if exc.code == "slow_consumer":
                await self._drop(exc.code, exc.message, stream_id)
            else:
                await self._send_error(exc, stream_id)
        finally:
            lease.close()
            if checkpoint is not None:
                checkpoint.end(finished)

    # -- sending ----------------------------------------------------------------------------

    async def _send_error(self, exc: EdgeError, stream_id: int | None) -> None:
        await self._send_text(
            protocol.error_message(exc.code, exc.message, stream_id, exc.retry_after_s)
        )

    async def _send_text(self, text: str) -> None:
        await self._send(lambda: self.websocket.send_text(text))

    async def _send_bytes(self, data: bytes) -> None:
        await self._send(lambda: self.websocket.send_bytes(data))

    async def _send(self, send: Callable[[], Awaitable[None]]) -> None:
        """One send, waited for at most ``server.send_timeout_s``. Raises :class:`_ClientGone`
        when the client has left, :class:`_SlowConsumer` when it did not take the send."""
        if self._dropped:
            raise _ClientGone
        async with self._send_lock:
            try:
                async with asyncio.timeout(self.config.send_timeout_s):
                    await send()
            except TimeoutError:
                log.warning(
                    "dropping a WebSocket client that took nothing for %.1f s",
                    self.config.send_timeout_s,
                )
                raise _SlowConsumer from None
            except (WebSocketDisconnect, RuntimeError, OSError) as exc:
                raise _ClientGone from exc

    async def _drop(self, code: str, message: str, stream_id: int | None = None) -> None:
        """End the connection with a last ``error`` and close 4001, each given a moment at
        most; whatever plays stops. Raises :class:`_ClientGone`."""
        if not self._dropped:
            self._dropped = True
            self._wake.set()
            await self._goodbye(CLOSE_SLOW_CONSUMER, code, message, stream_id=stream_id)
        raise _ClientGone

    async def _goodbye(
        self,
        close_code: int,
        code: str,
        message: str,
        retry_after_s: float | None = None,
        stream_id: int | None = None,
    ) -> None:
        """A last ``error`` and a close, neither waited for longer than a moment."""
        text = protocol.error_message(code, message, stream_id, retry_after_s)
        with contextlib.suppress(Exception):
            async with asyncio.timeout(GOODBYE_TIMEOUT_S):
                await self.websocket.send_text(text)
        with contextlib.suppress(Exception):
            async with asyncio.timeout(GOODBYE_TIMEOUT_S):
                await self.websocket.close(close_code)


def _wants_spill(header: str | None) -> bool:
    """The upgrade's ``X-Cadenza-Spill`` (:func:`protocol.wants_spill`); :class:`EdgeError`
    400 ``invalid_header`` for a value it does not take."""
    try:
        return protocol.wants_spill(header)
    except ProtocolError as exc:
        raise EdgeError(400, str(exc), code=exc.code, param=protocol.SPILL_HEADER) from exc


def _ready_message(info: EngineInfo, state: EdgeState) -> str:
    """``model``, ``voices`` and ``sample_rate``: the default model's; ``models``: every
    served model with its voices, sample rate and model-specific sampling fields; ``node``:
    the node that answered (``server.node_id``)."""
    models = [
        {
            "name": s.identity.model_name,
            "voices": list(s.identity.voices),
            "sample_rate": s.identity.sample_rate,
            "sampling_fields": list(s.identity.sampling_fields),
        }
        for s in state.services.values()
    ]
    return protocol.server_message(
        "ready",
        protocol=protocol.PROTOCOL_VERSION,
        session=uuid.uuid4().hex,
        node=state.config.server.node_name,
        model=info.model_name,
        voices=list(info.voices),
        models=models,
        formats=list(protocol.FORMATS),
        sample_rate=info.sample_rate,
        features=[f for f in protocol.FEATURES if f != "spill" or state.spills],
    )
