"""The SDK's session over a ``websockets`` connection (see the package docstring)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncGenerator, AsyncIterable, AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass
from typing import Any

import websockets
from websockets.asyncio.client import ClientConnection
from websockets.http11 import Response

from cadenza.edge.streams import protocol

RESUME_WITHIN_S = 20.0  # how long a session keeps trying to resume a dropped utterance
RESUME_LIVE_RETRY_S = 0.5  # a resume refused because the lost node still serves it: again after
# A node's in-session refusals for lack of room: another node may have it (docs/protocol.md).
CAPACITY_CODES = frozenset({"queue_full", "queue_timeout"})
OPUS_PACKET_SAMPLES = 960  # 20 ms at 48 kHz

Dial = Callable[[], Awaitable[tuple[ClientConnection, dict[str, Any]]]]


class StreamError(RuntimeError):
    """The server refused or ended an utterance with an error (``code`` from docs/protocol.md);
    ``retry_after_s`` is set when the server said when to try again (capacity, rate limits)."""

    def __init__(self, code: str, message: str, retry_after_s: float | None = None) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.retry_after_s = retry_after_s


@dataclass(frozen=True)
class AudioChunk:
    data: bytes  # pcm: s16le samples; opus: one packet; encodec: uint16 codes [frames, K]
    format: str
    sample_rate: int
    index: int
    segment: int | None = None  # a text stream's segment it belongs to (from 0)


class Session:
    """One connection. One utterance at a time: iterate :meth:`speak` to the end (or leave it
    to cancel) before starting the next."""

    def __init__(
        self,
        connection: ClientConnection,
        ready: dict[str, Any],
        redial: Dial | None = None,
        spill: Dial | None = None,
        credential: dict[str, str] | None = None,
    ) -> None:
        """``redial``: a new connection after one was lost (``None``: none); ``spill``: a new
        connection to a node that can start a stream at once, or a :class:`StreamError`
        (``None``: a refused utterance is not sent elsewhere); ``credential``: the headers
        every new connection is opened with, which :meth:`renew` updates."""
        self.connection = connection
        self.ready = ready
        self._credential = credential if credential is not None else {}
        self.resumes = 0  # utterances of this session resumed after the connection dropped
        # Utterances sent again on another node after theirs refused them for lack of room.
        self.spills = 0
        # From the last resumed utterance's lost connection to its first audio after (seconds).
        self.last_resume_gap_s: float | None = None
        self._redial = redial
        self._spill = spill
        self.last_stats: dict[str, Any] | None = None
        self.last_queued: dict[str, Any] | None = None  # the server's queue notice, if it sent one
        self.last_conversation: dict[str, Any] | None = None  # the latest "conversation" notice
        self.last_started: dict[str, Any] | None = None
        self.segments: list[
            str
        ] = []  # what the last speak_stream's server said, segment by segment
        self._microphone_rate: int | None = None

    async def speak(
        self,
        text: str,
        *,
        format: str = "pcm",
        voice: str = "default",
        sample_rate: int | None = None,
        max_duration_s: float | None = None,
        seed: int | None = None,
        priority: str = "realtime",
        use_audio_prompt: bool = False,
        model: str | None = None,
        conversation: bool = False,
        user_voice: str | None = None,
        user_text: str = "",
        **sampling: float | int,
    ) -> AsyncGenerator[AudioChunk, None]:
        """Audio chunks as the server streams them. ``model``: one of the server's models
        (``None``: its default); ``sampling``: ``temperature``, ``top_k``, ``top_p``,
        ``min_p``, ``repetition_penalty`` and the model-specific ``fine_temperature``,
        ``guidance_scale`` (unset: the model's defaults). ``conversation``:
        the session's earlier turns are the context (models that take one); with
        ``use_audio_prompt`` the microphone audio is the user's turn, spoken as
        ``user_voice`` and transcribed as ``user_text`` (docs/protocol.md). Raises
        :class:`StreamError`."""
        request = _speak_message(
            {"text": text, "voice": voice, "format": format, "priority": priority},
            use_audio_prompt=use_audio_prompt,
            sample_rate=sample_rate,
            max_duration_s=max_duration_s,
            seed=seed,
            model=model,
            user_voice=user_voice,
            **sampling,
        )
        if conversation:
            request |= {"conversation": True, "user_text": user_text}
        self.last_queued = self.last_started = self.last_stats = None
        # A session whose connection was lost between utterances sends the request again on
        # a new one, unless the request leans on what the lost session held (its microphone
        # audio, its conversation).
        again = not (use_audio_prompt or conversation)
        started = self.last_started = await self._start(request, again)
        stream_id, rate = started["stream_id"], started["sample_rate"]
        heard = _Heard(format)
        lost_at: float | None = None
        finished = False
        try:
            while True:
                try:
                    message = await self.connection.recv()
                except websockets.ConnectionClosed as exc:
                    token = started.get("resume_token")
                    if self._redial is None or token is None or not heard.resumable:
                        finished = True
                        raise _connection_lost(exc) from exc
                    lost_at = time.monotonic()
                    finished = True  # on no connection: nothing to cancel if the resume fails
                    started = self.last_started = await self._resume(token, heard)
                    finished = False
                    stream_id = started["stream_id"]
                    continue
                if isinstance(message, bytes):
                    frame = protocol.decode_audio_frame(message)
                    if frame.stream_id == stream_id:
                        if lost_at is not None:
                            self.last_resume_gap_s = time.monotonic() - lost_at
                            lost_at = None
                        heard.add(frame.payload)
                        yield AudioChunk(frame.payload, format, rate, heard.chunks - 1)
                    continue
                event = json.loads(message)
                if event.get("type") == "error":
                    finished = True
                    raise _stream_error(event)
                if event.get("type") == "done" and event.get("stream_id") == stream_id:
                    finished = True
                    self.last_stats = event.get("stats")
                    if conversation:  # what the conversation holds now
                        await self._next_control({"conversation"})
                    return
        finally:
            if not finished:
                # A connection that is gone needs no cancel: let its own error tell why.
                with suppress(websockets.ConnectionClosed):
                    await self._cancel(stream_id)

    async def speak_stream(
        self,
        text_source: AsyncIterable[str],
        *,
        format: str = "pcm",
        voice: str = "default",
        sample_rate: int | None = None,
        max_duration_s: float | None = None,
        seed: int | None = None,
        priority: str = "realtime",
        model: str | None = None,
        flush_on: Callable[[str], bool] | None = None,
        **sampling: float | int,
    ) -> AsyncGenerator[AudioChunk, None]:
        """Speak text while it is still arriving (a language model's token stream): each
        string ``text_source`` yields is sent as it comes, ``text_end`` when it ends, and the
        audio chunks of the one stream are yielded as the server sends them (it cuts the text
        into segments and plays them without gaps; ``segments`` lists what it said so far).
        ``flush_on(piece)``: send a ``flush`` after each piece for which it is true (e.g. the
        end of a turn). Other options as :meth:`speak` (``max_duration_s`` bounds each
        segment). Leaving the iterator early cancels the stream. Raises
        :class:`StreamError`; an exception of ``text_source`` cancels the stream and is
        raised here."""
        request = _speak_message(
            {"text": "", "text_stream": True, "voice": voice, "format": format},
            priority=priority,
            sample_rate=sample_rate,
            max_duration_s=max_duration_s,
            seed=seed,
            model=model,
            **sampling,
        )
        self.last_queued = self.last_started = self.last_stats = None
        self.segments = []
        started = self.last_started = await self._start(request, again=True)
        stream_id, rate = started["stream_id"], started["sample_rate"]

        async def feed() -> None:
            async for piece in text_source:
                if piece:
                    message = {"type": "text", "stream_id": stream_id, "text": piece}
                    await self.connection.send(json.dumps(message))
                if flush_on is not None and flush_on(piece):
                    await self.connection.send(
                        json.dumps({"type": "flush", "stream_id": stream_id})
                    )
            await self.connection.send(json.dumps({"type": "text_end", "stream_id": stream_id}))

        feeding = asyncio.ensure_future(feed())
        receiving: asyncio.Future[Any] | None = None
        chunks = 0
        finished = False
        try:
            while True:
                if receiving is None:
                    receiving = asyncio.ensure_future(self.connection.recv())
                waiting: set[asyncio.Future[Any]] = {receiving}
                if not feeding.done():
                    waiting.add(feeding)
                await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
                if feeding.done() and not feeding.cancelled():
                    failure = feeding.exception()
                    if failure is not None:
                        raise failure
                if not receiving.done():
                    continue
                received, receiving = receiving, None
                try:
                    message = received.result()
                except websockets.ConnectionClosed as exc:
                    finished = True
                    raise _connection_lost(exc) from exc
                if isinstance(message, bytes):
                    frame = protocol.decode_audio_frame(message)
                    if frame.stream_id == stream_id:
                        chunks += 1
                        segment = len(self.segments) - 1
                        yield AudioChunk(frame.payload, format, rate, chunks - 1, segment)
                    continue
                event = json.loads(message)
                kind = event.get("type")
                if kind == "segment" and event.get("stream_id") == stream_id:
                    self.segments.append(str(event["text"]))
                elif kind == "error" and event.get("stream_id") in (stream_id, None):
                    finished = True
                    raise _stream_error(event)
                elif kind == "done" and event.get("stream_id") == stream_id:
                    finished = True
                    self.last_stats = event.get("stats")
                    return
        finally:
            for task in (feeding, receiving):
                if task is not None and not task.done():
                    task.cancel()
                    with suppress(asyncio.CancelledError, Exception):
                        await task
            if not finished:
                with suppress(websockets.ConnectionClosed):
                    await self._cancel(stream_id)

    async def _start(self, request: dict[str, Any], again: bool) -> dict[str, Any]:
        """Send ``request`` and wait for its ``started``; when ``again``, once more on a new
        connection if this one is found closed (and the session may reconnect), or if its
        node refuses the utterance for lack of room and another node has room now."""
        try:
            await self.connection.send(json.dumps(request))
            return await self._next_control({"started"})
        except websockets.ConnectionClosed as exc:
            if self._redial is None or not again:
                raise _connection_lost(exc) from exc
            await self._reconnect()
        except StreamError as refused:
            if not (again and refused.code in CAPACITY_CODES and await self._move_to_room()):
                raise
        return await self._start(request, again=False)

    async def _move_to_room(self) -> bool:
        """A new connection to a node that can start a stream at once (the session's URL with
        ``X-Cadenza-Spill: 1``: a front door tries its nodes), in place of this one; ``False``,
        keeping this one, when the session does not spill or no node has room."""
        if self._spill is None or "spill" not in self.ready.get("features", ()):
            return False  # (a node alone has no other node to spill to)
        try:
            connection, ready = await self._spill()
        except (OSError, StreamError, websockets.InvalidHandshake, TimeoutError):
            return False
        previous, self.connection, self.ready = self.connection, connection, ready
        self._microphone_rate = None  # the new session has heard nothing yet
        self.spills += 1
        await previous.close()
        return True

    async def _reconnect(self) -> None:
        """A new connection to the session's URL, with backoff for up to
        :data:`RESUME_WITHIN_S`. Raises :class:`StreamError` ``connection_lost``."""
        assert self._redial is not None
        deadline = time.monotonic() + RESUME_WITHIN_S
        delay = 0.1
        while True:
            try:
                self.connection, self.ready = await self._redial()
                self._microphone_rate = None  # the new session has heard nothing yet
                return
            except (OSError, StreamError, websockets.InvalidHandshake, TimeoutError) as exc:
                if time.monotonic() + delay > deadline:
                    raise StreamError(
                        "connection_lost", f"no server could be reached again: {exc}"
                    ) from exc
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)

    async def _resume(self, token: str, heard: _Heard) -> dict[str, Any]:
        """Reconnect and resume the stream of ``token`` after what was ``heard``; the new
        ``started``. A refusal with ``resume_live`` (the lost node has not yet seen the
        connection go: it still serves the stream) is asked again every
        :data:`RESUME_LIVE_RETRY_S` within :data:`RESUME_WITHIN_S`. Raises
        :class:`StreamError`: the server's refusal, or ``connection_lost``."""
        deadline = time.monotonic() + RESUME_WITHIN_S
        await self._reconnect()
        message = {"type": "resume", "token": token, "samples_heard": heard.samples}
        while True:
            try:
                await self.connection.send(json.dumps(message))
                started = await self._next_control({"started"})
            except websockets.ConnectionClosed as exc:
                raise _connection_lost(exc) from exc
            except StreamError as refused:
                late = time.monotonic() + RESUME_LIVE_RETRY_S > deadline
                if refused.code != "resume_live" or late:
                    raise
                await asyncio.sleep(RESUME_LIVE_RETRY_S)
                continue
            self.resumes += 1
            return started

    async def renew(self, api_key: str) -> int | None:
        """Renew the session's credential with a fresh client token (or key) of the same
        client, between utterances and before the token it opened with expires (an expired
        token starts no utterance); connections opened later for this session (resumes,
        spills) use it too. Returns the new expiry (unix seconds; ``None`` for a key). Raises
        :class:`StreamError` with the server's refusal (the session keeps its credential)."""
        await self.connection.send(json.dumps({"type": "hello", "api_key": api_key}))
        try:
            answer = await self._next_control({"authenticated"})
        except websockets.ConnectionClosed as exc:
            raise _connection_lost(exc) from exc
        self._credential["Authorization"] = f"Bearer {api_key}"
        expires_at = answer.get("expires_at")
        return None if expires_at is None else int(expires_at)

    async def send_microphone(self, pcm: bytes, sample_rate: int = 16000) -> None:
        """Send 16-bit mono PCM as microphone audio; a later ``speak(use_audio_prompt=True)``
        uses the newest of it as its speech prompt."""
        if self._microphone_rate != sample_rate:
            message = {"type": "audio_in", "format": "pcm", "sample_rate": sample_rate}
            await self.connection.send(json.dumps(message))
            self._microphone_rate = sample_rate
        for start in range(0, len(pcm), 32768):
            await self.connection.send(pcm[start : start + 32768])

    async def reset_conversation(self) -> None:
        """Forget the session's conversation turns."""
        await self.connection.send(json.dumps({"type": "reset_conversation"}))
        await self._next_control({"conversation"})

    async def ping(self, data: Any = None) -> Any:
        await self.connection.send(json.dumps({"type": "ping", "data": data}))
        return (await self._next_control({"pong"})).get("data")

    async def _cancel(self, stream_id: int) -> None:
        """Cancel on the server and drain until its ``done`` for this utterance."""
        await self.connection.send(json.dumps({"type": "cancel"}))
        while True:
            message = await self.connection.recv()
            if isinstance(message, str):
                event = json.loads(message)
                if event.get("type") == "conversation":
                    self.last_conversation = dict(event)
                if event.get("type") in ("done", "error") and event.get("stream_id") == stream_id:
                    return

    async def _next_control(self, kinds: set[str]) -> dict[str, Any]:
        while True:
            message = await self.connection.recv()
            if isinstance(message, bytes):
                continue  # audio of an utterance that was cancelled
            event = json.loads(message)
            if event.get("type") == "error":
                raise _stream_error(event)
            if event.get("type") == "queued":
                self.last_queued = dict(event)
            if event.get("type") == "conversation":
                self.last_conversation = dict(event)
            if event.get("type") in kinds:
                return dict(event)


class _Heard:
    """How much of an utterance's audio arrived: chunks, and samples at its rate (``pcm``:
    two bytes each; ``opus``: 960 per 20 ms packet at 48 kHz). ``encodec`` streams do not
    resume (the frames per message depend on the model's codebooks)."""

    def __init__(self, format: str) -> None:
        self.format = format
        self.chunks = 0
        self.samples = 0

    @property
    def resumable(self) -> bool:
        return self.format in ("pcm", "opus")

    def add(self, payload: bytes) -> None:
        self.chunks += 1
        self.samples += len(payload) // 2 if self.format == "pcm" else OPUS_PACKET_SAMPLES


def _speak_message(fields: dict[str, Any], **optional: Any) -> dict[str, Any]:
    """A ``speak`` message: ``fields``, and each of ``optional`` that is set."""
    chosen = {key: value for key, value in optional.items() if value is not None}
    return {"type": "speak", **fields, **chosen}


def _connection_lost(exc: websockets.ConnectionClosed) -> StreamError:
    return StreamError("connection_lost", f"the connection closed: {exc}")


def _stream_error(event: dict[str, Any]) -> StreamError:
    retry = event.get("retry_after_s")
    return StreamError(event["code"], event["message"], None if retry is None else float(retry))


@asynccontextmanager
async def connect(
    url: str,
    api_key: str | None = None,
    *,
    resume: bool = True,
    spill: bool = True,
    **options: Any,
) -> AsyncIterator[Session]:
    """Open a session. ``options`` go to ``websockets.connect`` (e.g. ``open_timeout``); the
    session asks for no per-message compression unless ``compression`` says otherwise (audio
    does not compress, and deflating it costs both ends CPU).

    ``resume``: when the connection drops while an utterance plays and the server gave it a
    resume token (servers with stream checkpoints), reconnect to ``url`` (the front door: any
    node will do) with backoff for up to :data:`RESUME_WITHIN_S` and go on with the utterance
    from the audio already received (``pcm`` and ``opus``); the iterator of :meth:`Session.speak`
    carries on after a gap (a resume refused with ``resume_live``, while the lost node has not
    yet seen the connection go, is asked again). A resume that fails raises
    :class:`StreamError` with the server's reason. A ``speak`` that finds the connection
    closed before its utterance started is sent again on a new connection (unless it uses the
    lost session's microphone audio or conversation).

    ``spill``: each connection first asks for a node that can start a stream at once
    (``X-Cadenza-Spill: 1``): a full node refuses the upgrade with 503 ``at_capacity`` and a
    front door such as ``cadenza haproxy-config``'s tries another node. When none has room
    the session connects again without it and its utterances wait in a node's queue, as
    without ``spill``. An utterance the session's node refuses for lack of room
    (``queue_full``, ``queue_timeout``) is sent once more on a new connection to a node with
    room, when one has room now (with the same exceptions as above); ``Session.spills``
    counts those, where the node said it is one of a fleet (``spill`` in ``ready.features``;
    a node alone accepts the header and queues as usual). docs/scaling.md, "Spilling to
    another node"."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    options.setdefault("compression", None)

    async def dial() -> tuple[ClientConnection, dict[str, Any]]:
        if spill:
            try:
                return await open_session(spilling=True)
            except StreamError as refused:
                if refused.code != "at_capacity":
                    raise
        return await open_session(spilling=False)

    async def dial_with_room() -> tuple[ClientConnection, dict[str, Any]]:
        return await open_session(spilling=True)

    async def open_session(spilling: bool) -> tuple[ClientConnection, dict[str, Any]]:
        sent = {**headers, protocol.SPILL_HEADER: "1"} if spilling else headers
        try:
            connection = await websockets.connect(url, additional_headers=sent, **options)
        except websockets.InvalidStatus as refused:
            raise _refusal(refused.response) from None
        try:
            ready = json.loads(await connection.recv())
            if ready.get("type") == "error":
                raise StreamError(ready["code"], ready["message"], ready.get("retry_after_s"))
            if ready.get("type") != "ready" or ready.get("protocol") != protocol.PROTOCOL_VERSION:
                raise StreamError("protocol", f"unexpected greeting {ready!r}")
        except BaseException:
            await connection.close()
            raise
        return connection, ready

    connection, ready = await dial()
    session = Session(
        connection,
        ready,
        dial if resume else None,
        dial_with_room if spill else None,
        credential=headers,
    )
    try:
        yield session
    finally:
        await session.connection.close()


def _refusal(response: Response) -> StreamError:
    """A refused upgrade as the error the server gave (503 ``shutting_down``,
    ``engine_unavailable`` or ``at_capacity`` with ``Retry-After``; 400 ``invalid_header``),
    or the bare status if it gave none."""
    retry_after = response.headers.get("Retry-After")
    retry_after_s = float(retry_after) if retry_after and retry_after.isdigit() else None
    with suppress(ValueError, KeyError, TypeError, AttributeError):
        error = json.loads(response.body)["error"]
        return StreamError(str(error["code"]), str(error["message"]), retry_after_s)
    status = response.status_code
    return StreamError(f"http_{status}", "the upgrade was refused", retry_after_s)


def speak_sync(url: str, text: str, **speak_options: Any) -> bytes:
    """Blocking helper for scripts: the whole utterance's payload bytes, concatenated."""

    async def run() -> bytes:
        async with connect(url) as session:
            return b"".join([chunk.data async for chunk in session.speak(text, **speak_options)])

    return asyncio.run(run())
