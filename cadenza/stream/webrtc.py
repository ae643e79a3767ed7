"""WebRTC (aiortc): ``POST /v1/webrtc/offer`` and the peer connections it creates.

Each connection gets one outbound audio track, 48 kHz in 20 ms frames paced on the wall clock
from a :class:`JitterBuffer`, and a data channel labelled ``control`` that speaks the WebSocket
protocol's JSON vocabulary (``speak``, ``cancel``, ``ping``; the server answers ``started``,
``done``, ``error``, ``pong`` and sends ``stats`` every 500 ms). ``cancel`` (barge-in) empties
the jitter buffer at once and aborts the generation. An inbound microphone track is kept (its
newest ``limits.max_prompt_audio_s``) and becomes the speech prompt of a ``speak`` with
``use_audio_prompt``.
"""

from __future__ import annotations

import asyncio
import contextlib
import fractions
import json
import logging
import time
from typing import Any

import av
import numpy as np
from aiortc import RTCPeerConnection, RTCSessionDescription
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack
from fastapi import APIRouter, Request

from cadenza.admission.gate import AdmissionRefused
from cadenza.admission.priority_queues import Priority
from cadenza.admission.rate_limit import Grant, RateLimited
from cadenza.codecs.resampler import StreamResampler
from cadenza.engine.engine_client import EngineError
from cadenza.engine.request import SynthesisRequest
from cadenza.stream import protocol
from cadenza.stream.errors import ApiError
from cadenza.stream.jitter_buffer import FrameKind, JitterBuffer
from cadenza.stream.microphone import MicrophoneBuffer
from cadenza.stream.protocol import ProtocolError, Speak
from cadenza.stream.speak import synthesis_request
from cadenza.stream.state import EdgeState

log = logging.getLogger(__name__)

router = APIRouter()

RTC_RATE = 48000
FRAME_MS = 20
MAX_SDP_BYTES = 64 * 1024
STATS_INTERVAL_S = 0.5


class PacedAudioTrack(MediaStreamTrack):
    """Outbound audio: one 20 ms frame per ``recv`` at its wall-clock time."""

    kind = "audio"

    def __init__(self, buffer: JitterBuffer) -> None:
        super().__init__()
        self.buffer = buffer
        self.frame_samples = buffer.frame_samples
        self._start: float | None = None
        self._sent = 0
        self.send_jitter_ms: list[float] = []  # actual minus scheduled send time
        self.first_audio_at: float | None = None

    async def recv(self) -> av.AudioFrame:
        if self.readyState != "live":
            raise MediaStreamError
        now = time.monotonic()
        if self._start is None:
            self._start = now
        due = self._start + self._sent * FRAME_MS / 1000
        if due > now:
            await asyncio.sleep(due - now)
        self.send_jitter_ms.append(1000 * (time.monotonic() - due))
        if len(self.send_jitter_ms) > 3000:
            del self.send_jitter_ms[:1000]
        samples, kind = self.buffer.pop_frame()
        if kind is FrameKind.AUDIO and self.first_audio_at is None:
            self.first_audio_at = time.monotonic()
        pcm = (np.clip(samples, -1, 1) * 32767).astype("<i2")
        frame = av.AudioFrame.from_ndarray(pcm[None], format="s16", layout="mono")
        frame.sample_rate = RTC_RATE
        frame.pts = self._sent * self.frame_samples
        frame.time_base = fractions.Fraction(1, RTC_RATE)
        self._sent += 1
        return frame


class WebRTCSession:
    def __init__(self, pc: RTCPeerConnection, state: EdgeState, client: str) -> None:
        self.pc = pc
        self.state = state
        self.client = client  # identity for rate limits
        self.buffer = JitterBuffer(RTC_RATE, FRAME_MS, state.config.server.jitter_reserve_ms)
        self.track = PacedAudioTrack(self.buffer)
        self.channel: Any = None
        self._active: asyncio.Task[None] | None = None
        self._stream_id = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self._speak_started_at: float | None = None
        self.microphone: MicrophoneBuffer | None = None

    def attach(self) -> None:
        self.pc.addTrack(self.track)

        @self.pc.on("datachannel")
        def on_datachannel(channel: Any) -> None:
            if channel.label != "control":
                return
            self.channel = channel

            channel.on("message", lambda message: self._spawn(self._handle(message)))

            self._spawn(self._report_stats())

        @self.pc.on("track")
        def on_track(track: MediaStreamTrack) -> None:
            if track.kind == "audio":
                self._spawn(self._drain_microphone(track))

        @self.pc.on("connectionstatechange")
        async def on_state() -> None:
            if self.pc.connectionState in ("failed", "closed"):
                await self.close()

        self._spawn(self._expire_if_unconnected())

    async def _expire_if_unconnected(self) -> None:
        """A peer that never completes the connection does not hold a session."""
        await asyncio.sleep(self.state.config.server.webrtc_connect_timeout_s)
        if self.pc.connectionState != "connected":
            await self.close()

    async def close(self) -> None:
        await self._cancel_active()
        for task in list(self._tasks):
            task.cancel()
        self.track.stop()
        await self.pc.close()

    def _spawn(self, coroutine: Any) -> None:
        task = asyncio.create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _send(self, text: str) -> None:
        if self.channel is not None and self.channel.readyState == "open":
            self.channel.send(text)

    async def _handle(self, message: Any) -> None:
        if not isinstance(message, str):
            self._send(protocol.error_message("unexpected_binary", "send JSON text messages"))
            return
        try:
            parsed = protocol.parse_client_message(message)
        except ProtocolError as exc:
            self._send(protocol.error_message(exc.code, exc.message))
            return
        if isinstance(parsed, Speak):
            await self._speak(parsed)
        elif parsed.type in ("hello", "audio_in"):
            pass  # authentication happened on the offer; the microphone is the track
        elif parsed.type == "ping":
            self._send(protocol.server_message("pong", data=parsed.data))
        else:  # cancel, close
            await self._cancel_active()

    async def _speak(self, speak: Speak) -> None:
        if self._active is not None and not self._active.done():
            self._send(protocol.error_message("busy", "an utterance is playing; cancel it first"))
            return
        info = self.state.engine.info
        assert info is not None
        self._stream_id += 1
        try:
            if speak.format != "pcm" or speak.sample_rate not in (None, RTC_RATE):
                raise ProtocolError("invalid_message", "WebRTC audio is Opus at 48000 Hz")
            request = synthesis_request(speak, info, self.state.config.limits, self.microphone)
            grant = self.state.admit(self.client, speak.text, speak.max_duration_s)
        except ProtocolError as exc:
            self._send(protocol.error_message(exc.code, exc.message, self._stream_id))
            return
        except RateLimited as exc:
            self._send(protocol.rate_limited_message(exc, self._stream_id))
            return
        refusal = await self.state.screen(speak.text, self.client)
        if refusal is not None:
            self.state.settle(grant, 0.0)
            self._send(protocol.error_message("content_refused", refusal, self._stream_id))
            return
        self._active = asyncio.create_task(
            self._play(self._stream_id, request, grant, speak.priority)
        )

    async def _play(
        self, stream_id: int, request: SynthesisRequest, grant: Grant, priority: Priority
    ) -> None:
        info = self.state.engine.info
        assert info is not None

        async def queued(position: int, wait_s: float) -> None:
            self._send(protocol.queued_message(stream_id, position, wait_s))

        try:
            ticket = await self.state.acquire_slot(request, priority, queued)
        except AdmissionRefused as exc:
            self.state.settle(grant, 0.0)
            self._send(protocol.refused_message(exc, stream_id))
            return
        except BaseException:
            self.state.settle(grant, 0.0)
            raise
        resampler = StreamResampler(info.sample_rate, RTC_RATE)
        self.buffer.start()
        self.track.first_audio_at = None
        started = self._speak_started_at = time.monotonic()
        reason = "eos"
        self._send(
            protocol.server_message(
                "started",
                stream_id=stream_id,
                sample_rate=RTC_RATE,
                queued_s=round(ticket.waited_s, 3),
            )
        )
        outputs = self.state.engine.generate(request)
        self.state.metrics.streams_active.inc()
        try:
            async for output in outputs:
                self.buffer.push(resampler.process(output.audio))
                if output.finished:
                    self.buffer.push(resampler.flush())
                    self.buffer.end()
                    reason = output.finish_reason.value if output.finish_reason else "eos"
            # The engine is done with this stream: its slot goes to the next one while the
            # listener hears the buffered end.
            self.state.release_slot(ticket)
            while self.buffer.active:  # let the listener hear the end
                await asyncio.sleep(FRAME_MS / 1000)
            first = self.track.first_audio_at
            stats = {
                "ttfa_ms": round(1000 * (first - started), 1) if first else None,
                "underruns": self.buffer.stats.underruns,
                "longest_underrun_ms": self.buffer.stats.longest_underrun_ms,
                "audio_s": self.buffer.stats.frames_played * FRAME_MS / 1000,
            }
            self._send(
                protocol.server_message("done", stream_id=stream_id, reason=reason, stats=stats)
            )
            self.state.metrics.streams_finished.labels(reason=reason).inc()
        except EngineError as exc:
            self.buffer.clear()
            self._send(protocol.error_message(f"engine_{exc.code}", str(exc), stream_id))
        finally:
            self.state.settle(grant, self.buffer.stats.frames_played * FRAME_MS / 1000)
            self.state.release_slot(ticket)
            self.state.metrics.streams_active.dec()
            await outputs.aclose()

    async def _cancel_active(self) -> None:
        task, self._active = self._active, None
        self.buffer.clear()  # barge-in: nothing queued keeps playing
        if task is None or task.done():
            return
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        self._send(protocol.server_message("done", stream_id=self._stream_id, reason="cancelled"))

    async def _report_stats(self) -> None:
        while True:
            await asyncio.sleep(STATS_INTERVAL_S)
            jitter = sorted(self.track.send_jitter_ms[-500:])
            first = self.track.first_audio_at
            self._send(
                protocol.server_message(
                    "stats",
                    playing=self.buffer.active,
                    buffer_ms=round(self.buffer.depth_ms, 1),
                    underruns=self.buffer.stats.underruns,
                    ttfa_ms=None
                    if first is None or self._speak_started_at is None
                    else round(1000 * (first - self._speak_started_at), 1),
                    send_jitter_p99_ms=round(jitter[int(0.99 * (len(jitter) - 1))], 2)
                    if jitter
                    else None,
                )
            )

    async def _drain_microphone(self, track: MediaStreamTrack) -> None:
        """Keep the newest seconds of the microphone for ``use_audio_prompt``."""
        limit_s = self.state.config.limits.max_prompt_audio_s
        with contextlib.suppress(MediaStreamError):
            while True:
                frame = await track.recv()
                if not isinstance(frame, av.AudioFrame):
                    continue
                if self.microphone is None or self.microphone.sample_rate != frame.sample_rate:
                    self.microphone = MicrophoneBuffer("pcm", frame.sample_rate, limit_s)
                samples = frame.to_ndarray()
                channels = len(frame.layout.channels)
                if frame.format.is_planar:
                    mono = samples.mean(axis=0)
                else:
                    mono = samples.reshape(-1, channels).mean(axis=1)
                if samples.dtype == np.int16:
                    mono = mono / 32768.0
                self.microphone.append_samples(mono.astype(np.float32))


@router.post("/v1/webrtc/offer")
async def webrtc_offer(request: Request) -> dict[str, str]:
    state: EdgeState = request.app.state.edge
    client = state.authenticate(
        request.headers.get("authorization"), request.client.host if request.client else None
    )
    state.engine_info()  # 503 while the engine is not ready
    raw = await request.body()
    if len(raw) > MAX_SDP_BYTES:
        raise ApiError(413, f"offer exceeds {MAX_SDP_BYTES} bytes", code="body_too_large")
    try:
        body = json.loads(raw)
        if not isinstance(body, dict) or body.get("type") != "offer":
            raise ValueError('body must be {"sdp": ..., "type": "offer"}')
        offer = RTCSessionDescription(sdp=str(body["sdp"]), type="offer")
    except (ValueError, KeyError, UnicodeDecodeError) as exc:
        raise ApiError(400, f"invalid offer: {exc}", code="invalid_offer") from exc
    pc = RTCPeerConnection()
    session = WebRTCSession(pc, state, client)
    session.attach()
    try:
        await pc.setRemoteDescription(offer)
        await pc.setLocalDescription(await pc.createAnswer())
    except Exception as exc:  # aiortc raises several types for bad SDP
        await session.close()
        raise ApiError(400, f"invalid SDP: {exc}", code="invalid_sdp") from exc
    state.webrtc_sessions.add(session)
    pc.on("connectionstatechange", lambda: _forget_when_closed(state, session))
    return {"sdp": pc.localDescription.sdp, "type": pc.localDescription.type}


def _forget_when_closed(state: EdgeState, session: WebRTCSession) -> None:
    if session.pc.connectionState in ("failed", "closed"):
        state.webrtc_sessions.discard(session)
