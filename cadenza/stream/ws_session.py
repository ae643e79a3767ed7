"""``WS /v1/stream``: one WebSocket session, protocol version 1 (docs/protocol.md).

A session answers ``speak`` with a ``started`` message, binary audio frames and a ``done``
message; one utterance at a time (``cancel`` stops it at once, a second ``speak`` while one is
playing is refused with ``busy``). Bad messages get an ``error`` and the session goes on.

Timeouts keep hung clients from holding engine slots: a session that sends nothing while no
utterance plays is closed after ``server.ws_idle_timeout_s``; a client that stops reading is
closed with ``slow_consumer`` once a send has waited ``server.ws_send_timeout_s`` (its engine
request was already aborted when its queue of ``server.max_queued_chunks`` filled).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import numpy as np
from fastapi import APIRouter, WebSocket, WebSocketDisconnect

from cadenza.admission.api_keys import bearer_token
from cadenza.admission.gate import AdmissionRefused
from cadenza.admission.priority_queues import Priority
from cadenza.admission.rate_limit import Grant, RateLimited
from cadenza.codecs.opus import OpusPacketEncoder
from cadenza.codecs.resampler import StreamResampler
from cadenza.codecs.wav import float_to_s16le
from cadenza.engine.engine_client import EngineError
from cadenza.engine.request import StreamOutput, SynthesisRequest
from cadenza.stream import protocol
from cadenza.stream.microphone import MicrophoneBuffer
from cadenza.stream.protocol import AudioIn, Hello, ProtocolError, Speak
from cadenza.stream.speak import synthesis_request
from cadenza.stream.state import EdgeState

log = logging.getLogger(__name__)

router = APIRouter()

# WebSocket close codes (RFC 6455 and the private range).
CLOSE_NORMAL = 1000
CLOSE_UNAVAILABLE = 1013
CLOSE_IDLE = 4000
CLOSE_SLOW_CONSUMER = 4001
CLOSE_UNAUTHORIZED = 4003
HELLO_TIMEOUT_S = 10.0


@router.websocket("/v1/stream")
async def stream_endpoint(websocket: WebSocket) -> None:
    state: EdgeState = websocket.app.state.edge
    await WebSocketSession(websocket, state).run()


class _SlowConsumer(Exception):
    pass


@dataclass
class _PlayoutClock:
    """Server-side estimate of what a listener hears: playback starts with the first audio;
    a chunk sent after its own playback time would have found the player empty."""

    started_at: float | None = None
    audio_s: float = 0.0
    underruns: int = 0
    longest_underrun_ms: float = 0.0
    lateness_ms: list[float] = field(default_factory=list)

    def sent(self, seconds: float, now: float) -> None:
        if self.started_at is None:
            self.started_at = now
        late_ms = 1000 * (now - (self.started_at + self.audio_s))
        if late_ms > 0:
            self.underruns += 1
            self.longest_underrun_ms = max(self.longest_underrun_ms, late_ms)
        self.audio_s += seconds


class WebSocketSession:
    def __init__(self, websocket: WebSocket, state: EdgeState) -> None:
        self.websocket = websocket
        self.state = state
        self.config = state.config.server
        self._send_lock = asyncio.Lock()
        self._stream_ids = itertools.count(1)
        self._active: asyncio.Task[None] | None = None
        self._active_id: int | None = None
        self._microphone: MicrophoneBuffer | None = None
        self.client = "unknown"  # identity for rate limits, set by _authenticate

    async def run(self) -> None:
        await self.websocket.accept()
        info = self.state.engine.info
        if not self.state.engine.is_ready() or info is None:
            await self._send_text(
                protocol.error_message("engine_unavailable", "engine is not ready")
            )
            await self.websocket.close(CLOSE_UNAVAILABLE)
            return
        if not await self._authenticate():
            return
        await self._send_text(
            protocol.server_message(
                "ready",
                protocol=protocol.PROTOCOL_VERSION,
                session=uuid.uuid4().hex,
                model=info.model_name,
                voices=list(info.voices),
                formats=list(protocol.FORMATS),
                sample_rate=info.sample_rate,
            )
        )
        try:
            await self._receive_loop()
        except (WebSocketDisconnect, _SlowConsumer):
            pass
        finally:
            await self._stop_active()

    async def _authenticate(self) -> bool:
        """With API keys configured: a valid ``Authorization: Bearer`` header, or (with no
        header at all) a ``hello`` with a valid key as the first message, within 10 s."""
        keys = self.state.api_keys
        header = self.websocket.headers.get("authorization")
        peer = self.websocket.client.host if self.websocket.client else None
        if keys is None:
            self.client = f"ip:{peer}"
            return True
        key_id = keys.check(bearer_token(header))
        if key_id:
            self.client = f"key:{key_id}"
            return True
        try:
            if header is not None:
                raise ProtocolError("invalid_api_key", "wrong key in the Authorization header")
            message = await asyncio.wait_for(self.websocket.receive(), HELLO_TIMEOUT_S)
            if message["type"] == "websocket.disconnect":
                return False
            hello = protocol.parse_client_message(message.get("text") or "")
            if isinstance(hello, Hello) and (key_id := keys.check(hello.api_key)):
                self.client = f"key:{key_id}"
                return True
        except (TimeoutError, ProtocolError):
            pass
        await self._send_text(
            protocol.error_message("invalid_api_key", "missing or invalid API key")
        )
        await self.websocket.close(CLOSE_UNAUTHORIZED)
        return False

    async def _receive_loop(self) -> None:
        while True:
            timeout = (
                None if self._active and not self._active.done() else self.config.ws_idle_timeout_s
            )
            try:
                message = await asyncio.wait_for(self.websocket.receive(), timeout)
            except TimeoutError:
                await self._send_text(protocol.error_message("idle_timeout", "no activity"))
                await self.websocket.close(CLOSE_IDLE)
                return
            if message["type"] == "websocket.disconnect":
                return
            if message.get("bytes") is not None:
                await self._receive_audio(message["bytes"])
                continue
            try:
                parsed = protocol.parse_client_message(message.get("text") or "")
            except ProtocolError as exc:
                await self._send_text(protocol.error_message(exc.code, exc.message))
                continue
            if parsed.type == "close":
                await self._stop_active()
                await self.websocket.close(CLOSE_NORMAL)
                return
            if parsed.type == "ping":
                await self._send_text(protocol.server_message("pong", data=parsed.data))
            elif parsed.type == "cancel":
                await self._stop_active()
            elif isinstance(parsed, Hello):
                pass  # already authenticated (or the server is open)
            elif isinstance(parsed, AudioIn):
                self._microphone = MicrophoneBuffer(
                    parsed.format, parsed.sample_rate, self.state.config.limits.max_prompt_audio_s
                )
            else:
                await self._start(parsed)

    async def _receive_audio(self, data: bytes) -> None:
        if self._microphone is None:
            await self._send_text(
                protocol.error_message(
                    "unexpected_binary", "send audio_in before binary microphone audio"
                )
            )
            return
        try:
            self._microphone.append_bytes(data)
        except ProtocolError as exc:
            await self._send_text(protocol.error_message(exc.code, exc.message))

    async def _start(self, speak: Speak) -> None:
        if self._active is not None and not self._active.done():
            await self._send_text(
                protocol.error_message("busy", "an utterance is playing; cancel it first")
            )
            return
        info = self.state.engine.info
        assert info is not None
        stream_id = next(self._stream_ids)
        try:
            request = synthesis_request(speak, info, self.state.config.limits, self._microphone)
            rate = protocol.resolve_sample_rate(speak, info.sample_rate)
            grant = self.state.admit(self.client, speak.text, speak.max_duration_s)
        except ProtocolError as exc:
            await self._send_text(protocol.error_message(exc.code, exc.message, stream_id))
            return
        except RateLimited as exc:
            await self._send_text(protocol.rate_limited_message(exc, stream_id))
            return
        refusal = await self.state.screen(speak.text, self.client)
        if refusal is not None:
            self.state.settle(grant, 0.0)
            await self._send_text(protocol.error_message("content_refused", refusal, stream_id))
            return
        self._active_id = stream_id
        self._active = asyncio.create_task(
            self._play(stream_id, request, speak.format, rate, grant, speak.priority)
        )

    async def _stop_active(self) -> None:
        """Cancel the playing utterance (its engine request is aborted) and say so."""
        task, stream_id = self._active, self._active_id
        self._active = self._active_id = None
        if task is None or task.done():
            return
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        with contextlib.suppress(Exception):
            await self._send_text(
                protocol.server_message("done", stream_id=stream_id, reason="cancelled")
            )

    async def _play(
        self,
        stream_id: int,
        request: SynthesisRequest,
        fmt: str,
        rate: int,
        grant: Grant,
        priority: Priority,
    ) -> None:
        info = self.state.engine.info
        assert info is not None
        encode = _payload_encoder(fmt, info.sample_rate, rate, info.frame_rate)
        clock = _PlayoutClock()

        async def queued(position: int, wait_s: float) -> None:
            await self._send_text(protocol.queued_message(stream_id, position, wait_s))

        try:
            ticket = await self.state.acquire_slot(request, priority, queued)
        except AdmissionRefused as exc:
            self.state.settle(grant, 0.0)
            await self._send_text(protocol.refused_message(exc, stream_id))
            if self._active_id == stream_id:
                self._active_id = None
            return
        except BaseException:
            self.state.settle(grant, 0.0)
            raise
        started = time.perf_counter()
        ttfa_ms: float | None = None
        index = 0
        outputs = self.state.engine.generate(request)
        self.state.metrics.streams_active.inc()
        try:
            await self._send_text(
                protocol.server_message(
                    "started",
                    stream_id=stream_id,
                    format=fmt,
                    sample_rate=rate,
                    queued_s=round(ticket.waited_s, 3),
                )
            )
            async for output in outputs:
                for payload, seconds in encode(output, output.finished):
                    await self._send_bytes(protocol.encode_audio_frame(stream_id, index, payload))
                    now = time.perf_counter()
                    if ttfa_ms is None:
                        ttfa_ms = 1000 * (now - started)
                    clock.sent(seconds, now)
                    index += 1
                if output.finished:
                    reason = output.finish_reason.value if output.finish_reason else "eos"
                    stats = {
                        "ttfa_ms": round(ttfa_ms or 0.0, 1),
                        "audio_s": round(clock.audio_s, 3),
                        "chunks": index,
                        "underruns": clock.underruns,
                        "longest_underrun_ms": round(clock.longest_underrun_ms, 1),
                    }
                    await self._send_text(
                        protocol.server_message(
                            "done", stream_id=stream_id, reason=reason, stats=stats
                        )
                    )
                    self.state.metrics.streams_finished.labels(reason=reason).inc()
        except EngineError as exc:
            if exc.code == "slow_consumer":
                with contextlib.suppress(Exception):
                    await self._send_text(protocol.error_message(exc.code, str(exc), stream_id))
                    await self.websocket.close(CLOSE_SLOW_CONSUMER)
                return
            await self._send_text(protocol.error_message(f"engine_{exc.code}", str(exc), stream_id))
        finally:
            self.state.settle(grant, clock.audio_s)
            self.state.release_slot(ticket)
            self.state.metrics.streams_active.dec()
            await outputs.aclose()
            if self._active_id == stream_id:
                self._active_id = None

    async def _send_text(self, text: str) -> None:
        async with self._send_lock:
            await self._with_send_timeout(self.websocket.send_text(text))

    async def _send_bytes(self, data: bytes) -> None:
        async with self._send_lock:
            await self._with_send_timeout(self.websocket.send_bytes(data))

    async def _with_send_timeout(self, send: Awaitable[None]) -> None:
        try:
            await asyncio.wait_for(send, self.config.ws_send_timeout_s)
        except TimeoutError as exc:
            log.warning("dropping a WebSocket client that stopped reading")
            with contextlib.suppress(Exception):
                await self.websocket.close(CLOSE_SLOW_CONSUMER)
            raise _SlowConsumer from exc


PayloadEncoder = Callable[[StreamOutput, bool], list[tuple[bytes, float]]]


def _payload_encoder(fmt: str, native_rate: int, rate: int, frame_rate: float) -> PayloadEncoder:
    """A function turning each engine output into ``(payload, audio seconds)`` pairs."""
    if fmt == "encodec":
        frame_s = 1.0 / frame_rate

        def encodec(output: StreamOutput, final: bool) -> list[tuple[bytes, float]]:
            codes = output.codes
            if codes is None or not codes.size:
                return []
            return [(codes.astype("<u2").tobytes(), codes.shape[0] * frame_s)]

        return encodec
    if fmt == "opus":
        opus = OpusPacketEncoder(native_rate)

        def opus_packets(output: StreamOutput, final: bool) -> list[tuple[bytes, float]]:
            packets = opus.encode(output.audio)
            if final:
                packets += opus.finish()
            return [(packet, 0.02) for packet in packets]

        return opus_packets
    resampler = StreamResampler(native_rate, rate)

    def pcm(output: StreamOutput, final: bool) -> list[tuple[bytes, float]]:
        samples = resampler.process(output.audio)
        if final:
            samples = np.concatenate([samples, resampler.flush()])
        if not samples.size:
            return []
        return [(float_to_s16le(samples), samples.size / rate)]

    return pcm
