"""WebRTC (aiortc): ``POST /v1/webrtc/offer`` and the peer connections it creates.

Each connection gets one outbound audio track, 48 kHz in 20 ms frames paced on the wall clock
from a :class:`JitterBuffer`, and a data channel labelled ``control`` that speaks the WebSocket
protocol's JSON vocabulary through a :class:`SpeakSession` (``speak``, ``cancel``, ``ping``,
``close``; the server answers ``started``, ``done``, ``error``, ``pong`` and sends ``stats``
every 500 ms). Control messages are handled one at a time, in order. ``cancel`` (barge-in)
empties the jitter buffer at once and aborts the generation. An inbound microphone track is
kept (its newest ``limits.max_prompt_audio_s``) and becomes the speech prompt of a ``speak``
with ``use_audio_prompt``.

Peers that never connect are closed after ``server.webrtc_connect_timeout_s``, with every task
and socket they held; at most ``server.max_pending_webrtc_offers`` wait to connect at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import fractions
import logging
import time
from collections.abc import Coroutine
from typing import Any

import av
import numpy as np
from aiortc import RTCPeerConnection, RTCSessionDescription
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack
from fastapi import APIRouter, Request

from cadenza.contract.engine_info import EngineInfo
from cadenza.contract.request import SynthesisRequest
from cadenza.edge.media.resampler import StreamResampler
from cadenza.edge.server.state import EdgeState
from cadenza.edge.streams import protocol
from cadenza.edge.streams.checkpoints import StreamHead, seeded
from cadenza.edge.streams.conversation import SaidFrames
from cadenza.edge.streams.errors import EdgeError
from cadenza.edge.streams.lease import StreamLease
from cadenza.edge.streams.protocol import ProtocolError, Speak
from cadenza.edge.streams.resume_token import new_token
from cadenza.edge.streams.speak_session import (
    CloseConnection,
    Event,
    ResumeUtterance,
    Send,
    SpeakSession,
    StartUtterance,
    StopUtterance,
)
from cadenza.edge.streams.stream_resume import Resumed, claim_and_admit
from cadenza.edge.streams.untrusted_json import JsonRejected, parse_json
from cadenza.edge.streams.utterance_tasks import UtteranceTasks
from cadenza.edge.transports.http_io import read_body
from cadenza.edge.transports.jitter_buffer import FrameKind, JitterBuffer
from cadenza.edge.transports.webrtc_ice import (
    announce_address,
    browser_ice_servers,
    rtc_configuration,
)

log = logging.getLogger(__name__)

router = APIRouter()

RTC_RATE = 48000
FRAME_MS = 20
MAX_SDP_BYTES = 64 * 1024
STATS_INTERVAL_S = 0.5
PLAY_OUT_MARGIN_S = 2.0  # how much longer than its length a last utterance may take to play


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


def check_webrtc_speak(speak: Speak) -> int:
    """WebRTC audio is the track: Opus at 48 kHz; a ``speak`` can only ask for that."""
    if speak.format != "pcm" or speak.sample_rate not in (None, RTC_RATE):
        raise ProtocolError("invalid_message", "WebRTC audio is Opus at 48000 Hz")
    return RTC_RATE


class WebRTCSession:
    def __init__(self, pc: RTCPeerConnection, state: EdgeState, client: str) -> None:
        info = state.default.require_ready()
        self.pc = pc
        self.state = state
        self.client = client  # identity for rate limits
        self.buffer = JitterBuffer(RTC_RATE, FRAME_MS, state.config.server.jitter_reserve_ms)
        self.track = PacedAudioTrack(self.buffer)
        self.session = SpeakSession(
            check_speak=check_webrtc_speak,
            codec_sample_rate=info.sample_rate,
            max_prompt_audio_s=state.config.limits.max_prompt_audio_s,
            max_context_s=state.config.limits.max_context_s,
            binary_audio=False,
        )
        self.channel: Any = None
        self.connected = False
        self.closed = False
        self._inbox: asyncio.Queue[str | bytes] = asyncio.Queue(maxsize=256)
        self._tasks: set[asyncio.Task[None]] = set()
        self._playing = UtteranceTasks(spawn=self._spawn)
        self._speak_started_at: float | None = None
        self._stream_id: int | None = None  # the utterance playing, for the stats' position
        self._heard_base = 0  # 48 kHz samples of it heard before it came to this node

    @property
    def pending(self) -> bool:
        """Offered but not connected yet."""
        return not self.connected and not self.closed

    def attach(self) -> None:
        self.pc.addTrack(self.track)

        @self.pc.on("datachannel")
        def on_datachannel(channel: Any) -> None:
            if channel.label != "control" or self.channel is not None:
                return
            self.channel = channel
            channel.on("message", self._enqueue)
            self._spawn(self._control_loop())
            self._spawn(self._report_stats())

        @self.pc.on("track")
        def on_track(track: MediaStreamTrack) -> None:
            if track.kind == "audio":
                self._spawn(self._drain_microphone(track))

        @self.pc.on("connectionstatechange")
        async def on_state() -> None:
            if self.pc.connectionState == "connected":
                self.connected = True
            elif self.pc.connectionState in ("failed", "closed"):
                await self.close()

        self._spawn(self._expire_if_unconnected())

    async def close(self) -> None:
        """Stop everything this peer holds: utterances (their streams end), tasks, the track
        and the connection. Idempotent; safe to call from one of the session's own tasks."""
        if self.closed:
            return
        self.closed = True
        self.state.webrtc_sessions.discard(self)
        await self._playing.stop_all()
        current = asyncio.current_task()
        for task in list(self._tasks):
            if task is not current:
                task.cancel()
        self.track.stop()
        await self.pc.close()

    # -- control messages -------------------------------------------------------------------

    def _enqueue(self, message: str | bytes) -> None:
        try:
            self._inbox.put_nowait(message)
        except asyncio.QueueFull:
            self._send(protocol.error_message("busy", "too many control messages at once"))

    async def _control_loop(self) -> None:
        """Every control message in order, each carried out before the next."""
        while True:
            message = await self._inbox.get()
            if isinstance(message, str):
                events = self.session.receive_text(message)
            else:
                events = self.session.receive_bytes(message)
            await self._execute(events)

    async def _execute(self, events: list[Event]) -> None:
        for event in events:
            if isinstance(event, Send):
                self._send(event.text)
            elif isinstance(event, StartUtterance | ResumeUtterance):
                self._playing.start(event.stream_id, self._play(event))
            elif isinstance(event, StopUtterance):
                self.buffer.clear()  # barge-in: nothing queued keeps playing
                await self._playing.stop(event.stream_id)
            elif isinstance(event, CloseConnection):
                self._spawn(self.close())

    def _send(self, text: str) -> None:
        if self.channel is not None and self.channel.readyState == "open":
            self.channel.send(text)

    # -- an utterance -----------------------------------------------------------------------

    async def _play(self, start: StartUtterance | ResumeUtterance) -> None:
        said = SaidFrames()
        try:
            if isinstance(start, StartUtterance):
                await self._play_utterance(start, said)
            else:
                await self._resume_utterance(start, said)
        finally:
            for event in self.session.utterance_ended(start.stream_id, said):
                if isinstance(event, Send):
                    self._send(event.text)

    async def _play_utterance(self, start: StartUtterance, said: SaidFrames) -> None:
        stream_id = start.stream_id

        async def queued(position: int, wait_s: float) -> None:
            self._send(protocol.queued_message(stream_id, position, wait_s))

        try:
            service = self.state.service(start.speak.model, transport="webrtc")
            info = service.info()
            lease = await service.admission.open(
                transport="webrtc",
                client=self.client,
                request=self._checkpointable(start.synthesis_request(info.default_sampling)),
                priority=start.speak.priority,
                on_queued=queued,
            )
        except EdgeError as exc:
            self._send(protocol.error_message(exc.code, exc.message, stream_id, exc.retry_after_s))
            return
        head = StreamHead(
            service.name, self.client, "pcm", RTC_RATE, lease.request, start.speak.priority
        )
        await self._stream(stream_id, lease, info, head, said, Resumed.fresh())

    def _checkpointable(self, request: SynthesisRequest) -> SynthesisRequest:
        """With checkpoints, every stream has a seed (see :func:`seeded`)."""
        return request if self.state.checkpoints is None else seeded(request)

    async def _resume_utterance(self, start: ResumeUtterance, said: SaidFrames) -> None:
        """Go on with a stream whose node was lost (``samples_heard`` counts the track's 48
        kHz samples, as the ``stats`` messages' ``played_samples`` do)."""
        try:
            claimed = await claim_and_admit(
                self.state, start.resume, self.client, "webrtc", heard_rate=RTC_RATE
            )
        except EdgeError as exc:
            message = protocol.error_message(exc.code, exc.message, start.stream_id)
            self._send(message)
            return
        await self._stream(
            start.stream_id, claimed.lease, claimed.info, claimed.head, said, claimed.resumed
        )

    async def _stream(
        self,
        stream_id: int,
        lease: StreamLease,
        info: EngineInfo,
        head: StreamHead,
        said: SaidFrames,
        resumed: Resumed,
    ) -> None:
        """Play the lease's audio on the track as utterance ``stream_id`` (``started``, the
        audio, ``done``), writing its checkpoint as it goes when the server keeps them."""
        said.frame_rate = info.frame_rate
        resampler = StreamResampler(info.sample_rate, RTC_RATE)
        checkpoint, token = None, None
        if self.state.checkpoints is not None:
            token = new_token()
            checkpoint = self.state.checkpoints.begin(token, head, resumed.rows, resumed.at)
        self.buffer.start()
        self.track.first_audio_at = None
        started = self._speak_started_at = time.monotonic()
        self._stream_id = stream_id
        heard = resumed.at.samples + (resumed.drop if resumed.unit == "samples" else 0)
        self._heard_base = round(heard * RTC_RATE / info.sample_rate)
        finished = False
        reason = "eos"
        fields: dict[str, object] = {
            "stream_id": stream_id,
            "sample_rate": RTC_RATE,
            "queued_s": round(lease.queued_s, 3),
        }
        if token is not None:
            fields["resume_token"] = token
        if resumed.rows is not None:
            fields["resumed"] = True
        self._send(protocol.server_message("started", **fields))
        try:
            async with contextlib.aclosing(lease.outputs()) as outputs:
                async for output in outputs:
                    said.add(output)
                    if checkpoint is not None:
                        checkpoint.record(output)
                    output, resumed = resumed.pass_on(output, self.state.metrics)
                    self.buffer.push(resampler.process(output.audio))
                    if output.finished:
                        self.buffer.push(resampler.flush())
                        self.buffer.end()
                        reason = output.finish_reason.value if output.finish_reason else "eos"
            lease.close()  # the engine is done: free the slot while the listener hears the end
            await self._play_out()
            finished = True
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
        except EdgeError as exc:
            finished = True  # it failed here: nothing to resume
            self.buffer.clear()
            self._send(protocol.error_message(exc.code, exc.message, stream_id, exc.retry_after_s))
        finally:
            lease.close()
            self._stream_id = None
            if checkpoint is not None:
                checkpoint.end(finished)

    async def _play_out(self) -> None:
        """Wait until the buffered audio has played, or for as long as it should take plus a
        margin: a track that nobody reads does not hold the utterance forever."""
        deadline = time.monotonic() + self.buffer.depth_ms / 1000 + PLAY_OUT_MARGIN_S
        while self.buffer.active and time.monotonic() < deadline:
            await asyncio.sleep(FRAME_MS / 1000)
        if self.buffer.active:
            log.info("WebRTC track stopped being read; dropping its buffered audio")
            self.buffer.clear()

    # -- background -------------------------------------------------------------------------

    def _spawn(self, coroutine: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _expire_if_unconnected(self) -> None:
        """A peer that never completes the connection does not hold a session."""
        await asyncio.sleep(self.state.config.server.webrtc_connect_timeout_s)
        if not self.connected:
            log.info("closing a WebRTC peer that did not connect in time")
            await self.close()

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
                    **self._position(),
                )
            )

    def _position(self) -> dict[str, int]:
        """While an utterance plays: its ``stream_id`` and ``played_samples``, the 48 kHz
        samples of it the track has sent (counting from its start, across a resume): what a
        client that loses this node sends back in ``resume``."""
        if self._stream_id is None:
            return {}
        played = self._heard_base + self.buffer.stats.frames_played * self.buffer.frame_samples
        return {"stream_id": self._stream_id, "played_samples": played}

    async def _drain_microphone(self, track: MediaStreamTrack) -> None:
        """Keep the newest seconds of the microphone for ``use_audio_prompt``."""
        with contextlib.suppress(MediaStreamError):
            while True:
                frame = await track.recv()
                if not isinstance(frame, av.AudioFrame):
                    continue
                samples = frame.to_ndarray()
                channels = len(frame.layout.channels)
                if frame.format.is_planar:
                    mono = samples.mean(axis=0)
                else:
                    mono = samples.reshape(-1, channels).mean(axis=1)
                if samples.dtype == np.int16:
                    mono = mono / 32768.0
                self.session.hear(mono.astype(np.float32), frame.sample_rate)


def parse_offer(raw: bytes) -> RTCSessionDescription:
    """An offer body ``{"sdp": ..., "type": "offer"}``. Raises :class:`EdgeError` 400
    ``invalid_offer``."""
    try:
        body = parse_json(raw)
    except JsonRejected as exc:
        raise EdgeError(400, f"invalid offer: {exc}", code="invalid_offer") from exc
    if not isinstance(body, dict) or body.get("type") != "offer":
        raise EdgeError(
            400, 'invalid offer: body must be {"sdp": ..., "type": "offer"}', code="invalid_offer"
        )
    sdp = body.get("sdp")
    if not isinstance(sdp, str) or not sdp:
        raise EdgeError(400, "invalid offer: sdp must be a non-empty string", code="invalid_offer")
    return RTCSessionDescription(sdp=sdp, type="offer")


@router.post("/v1/webrtc/offer")
async def webrtc_offer(request: Request) -> dict[str, str]:
    state: EdgeState = request.app.state.edge
    server = state.config.server
    client = state.authenticate(
        request.headers.get("authorization"), request.client.host if request.client else None
    )
    state.lifecycle.check_open()  # 503 shutting_down while the server drains
    state.engine_info()  # 503 while the engine is not ready
    raw = await read_body(request, max_bytes=MAX_SDP_BYTES, timeout_s=server.request_body_timeout_s)
    offer = parse_offer(raw)
    if (
        sum(session.pending for session in state.webrtc_sessions)
        >= server.max_pending_webrtc_offers
    ):
        raise EdgeError(
            503,
            f"{server.max_pending_webrtc_offers} WebRTC peers are already waiting to connect",
            code="too_many_offers",
            retry_after_s=server.webrtc_connect_timeout_s,
        )
    pc = RTCPeerConnection(rtc_configuration(server))
    session = WebRTCSession(pc, state, client)
    session.attach()
    state.webrtc_sessions.add(session)
    try:
        await pc.setRemoteDescription(offer)
        await pc.setLocalDescription(await pc.createAnswer())
    except Exception as exc:  # aiortc raises several types for bad SDP
        await session.close()
        raise EdgeError(400, f"invalid SDP: {exc}", code="invalid_sdp") from exc
    answer = announce_address(pc.localDescription.sdp, server.webrtc_public_address)
    return {"sdp": answer, "type": pc.localDescription.type}


@router.get("/v1/webrtc/config")
async def webrtc_config(request: Request) -> dict[str, Any]:
    """What a browser needs before its offer: the ICE servers (``RTCPeerConnection``'s
    ``iceServers``), so that it relays through the same TURN server as the node."""
    state: EdgeState = request.app.state.edge
    return {"ice_servers": browser_ice_servers(state.config.server)}
