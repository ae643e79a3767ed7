"""WebRTC (aiortc): ``POST /v1/webrtc/offer`` and the peer connections it creates.

Each connection gets one outbound audio track, 48 kHz in 20 ms frames paced on the wall clock
from a :class:`JitterBuffer`, and a data channel labelled ``control`` that speaks the WebSocket
protocol's JSON vocabulary through a :class:`SpeakSession` (``speak``, ``cancel``, ``ping``,
``close``; the server answers ``started``, ``done``, ``error``, ``pong`` and sends ``stats``
every 500 ms). Control messages are handled one at a time, in order. ``cancel`` (barge-in)
empties the jitter buffer at once and aborts the generation. An inbound microphone track is
kept (its newest ``limits.max_prompt_audio_s``) and becomes the speech prompt of a ``speak``
with ``use_audio_prompt``.

A control message larger than ``server.ws_max_message_bytes`` is refused unread with an
``error`` ``message_too_large`` (:func:`oversized`), and a binary one with
``unexpected_binary``; the peer stays usable, as a WebSocket does after a bad message.

Peers that never connect are closed after ``server.webrtc_connect_timeout_s``, with every task
and socket they held; at most ``server.max_pending_webrtc_offers`` wait to connect at once
(``server.max_pending_webrtc_offers_per_client`` of one credential). A connected peer that sends
no control message while nothing plays for ``server.webrtc_idle_timeout_s`` is told
``idle_timeout`` and closed, by the rule an idle WebSocket session is closed by
(:meth:`SpeakSession.idle_timeout_s`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Coroutine
from typing import Any

import av
import numpy as np
from aiortc import RTCPeerConnection
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack

from cadenza.contract.request import FinishReason
from cadenza.edge.auth.principal import Principal
from cadenza.edge.media.resampler import StreamResampler
from cadenza.edge.server.state import EdgeState
from cadenza.edge.streams import protocol
from cadenza.edge.streams.conversation import SaidFrames
from cadenza.edge.streams.errors import EdgeError
from cadenza.edge.streams.protocol import ProtocolError, Speak
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
from cadenza.edge.transports.jitter_buffer import JitterBuffer
from cadenza.edge.transports.paced_track import FRAME_MS, RTC_RATE, PacedAudioTrack

log = logging.getLogger(__name__)

STATS_INTERVAL_S = 0.5
PLAY_OUT_MARGIN_S = 2.0  # how much longer than its length a last utterance may take to play


def oversized(message: str | bytes, limit_bytes: int) -> str | None:
    """Why a control message is refused unread (``None``: it is not): its size, in bytes
    as sent (UTF-8 for text), is over ``limit_bytes``."""
    size = len(message if isinstance(message, bytes) else message.encode(errors="surrogatepass"))
    if size <= limit_bytes:
        return None
    return f"a control message of {size} bytes; the limit is {limit_bytes}"


def check_webrtc_speak(speak: Speak) -> int:
    """WebRTC audio is the track: Opus at 48 kHz; a ``speak`` can only ask for that."""
    if speak.format != "pcm" or speak.sample_rate not in (None, RTC_RATE):
        raise ProtocolError("invalid_message", "WebRTC audio is Opus at 48000 Hz")
    return RTC_RATE


class WebRTCSession:
    def __init__(
        self,
        pc: RTCPeerConnection,
        state: EdgeState,
        principal: Principal,
        *,
        peer: str | None = None,
        origin: str | None = None,
    ) -> None:
        """``principal``: who made the offer, from ``peer`` with ``Origin`` ``origin`` (a
        ``hello`` on the control channel renews it:
        :mod:`~cadenza.edge.streams.session_credential`)."""
        info = state.default.require_ready()
        self.pc = pc
        self.state = state
        self.principal = principal
        self.peer = peer
        self.origin = origin
        self.buffer = JitterBuffer(RTC_RATE, FRAME_MS, state.config.server.jitter_reserve_ms)
        self.track = PacedAudioTrack(self.buffer)
        self.session = SpeakSession(
            check_speak=check_webrtc_speak,
            codec_rate=lambda speak: state.native_rate(speak.model, info),
            max_prompt_audio_s=state.config.limits.max_prompt_audio_s,
            max_context_s=state.config.limits.max_context_s,
            binary_audio=False,
            idle_timeout_s=state.config.server.webrtc_idle_timeout_s,
            max_message_chars=state.config.limits.max_input_chars,
            max_text_stream_chars=state.config.text_stream.max_chars,
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
        self._text_streams: dict[int, TextStream] = {}  # by stream id, while they play
        self._active_at = time.monotonic()  # the last control message, or an utterance's end

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
                if not self.connected:
                    self.connected = True
                    self._active_at = time.monotonic()
                    self._spawn(self._close_when_idle())
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
        self._active_at = time.monotonic()
        too_large = oversized(message, self.state.config.server.ws_max_message_bytes)
        if too_large is not None:
            self._send(protocol.error_message("message_too_large", too_large))
            return
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
            elif isinstance(event, FeedText):
                feed_text(self._text_streams.get(event.stream_id), event)
            elif isinstance(event, StopUtterance):
                self.buffer.clear()  # barge-in: nothing queued keeps playing
                await self._playing.stop(event.stream_id)
            elif isinstance(event, CloseConnection):
                self._spawn(self.close())
            elif isinstance(event, Renew):
                self.principal, answer = renewed(
                    self.state.auth, self.principal, event.credential, self.peer, self.origin
                )
                self._send(answer)

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
            self._active_at = time.monotonic()  # the idle clock starts when it ends
            for event in self.session.utterance_ended(start.stream_id, said):
                if isinstance(event, Send):
                    self._send(event.text)

    async def _play_utterance(self, start: StartUtterance, said: SaidFrames) -> None:
        stream_id = start.stream_id

        async def queued(position: int, wait_s: float) -> None:
            self._send(protocol.queued_message(stream_id, position, wait_s))

        try:
            try:
                opened = await open_utterance(
                    self.state,
                    start,
                    self.principal,
                    "webrtc",
                    audio_format="pcm",
                    on_queued=queued,
                    on_text_stream=functools.partial(self._text_streams.__setitem__, stream_id),
                )
            except EdgeError as exc:
                self._send(
                    protocol.error_message(exc.code, exc.message, stream_id, exc.retry_after_s)
                )
                return
            await self._stream(stream_id, opened, said, Resumed.fresh())
        finally:
            self._text_streams.pop(stream_id, None)

    async def _resume_utterance(self, start: ResumeUtterance, said: SaidFrames) -> None:
        """Go on with a stream whose node was lost (``samples_heard`` counts the track's 48
        kHz samples, as the ``stats`` messages' ``played_samples`` do)."""
        try:
            claimed = await claim_and_admit(
                self.state, start.resume, self.principal, "webrtc", heard_rate=RTC_RATE
            )
        except EdgeError as exc:
            message = protocol.error_message(exc.code, exc.message, start.stream_id)
            self._send(message)
            return
        opened = OpenedUtterance(claimed.info, claimed.lease, claimed.head, None)
        await self._stream(start.stream_id, opened, said, claimed.resumed)

    async def _stream(
        self, stream_id: int, opened: OpenedUtterance, said: SaidFrames, resumed: Resumed
    ) -> None:
        """Play the lease's audio on the track as utterance ``stream_id`` (``started``, the
        audio, ``done``), writing its checkpoint as it goes when the server keeps them; a text
        stream's (``text``) segment by segment, each announced with ``segment``."""
        lease, info, head, text = opened.lease, opened.info, opened.head, opened.text
        said.frame_rate = info.frame_rate
        resampler = StreamResampler(info.sample_rate, RTC_RATE)
        checkpoint, token = None, None
        if self.state.checkpoints is not None and text is None:
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
        if text is not None:
            fields["text_stream"] = True
        self._send(protocol.server_message("started", **fields))
        try:
            items = lease.outputs() if text is None else text.play(lease, self.principal)
            async with contextlib.aclosing(items) as outputs:
                async for output in outputs:
                    if isinstance(output, SegmentStarted):
                        self.buffer.release()
                        said.text = text.spoken_text if text else None
                        self._send(segment_message(stream_id, output))
                        continue
                    if isinstance(output, WaitingForText):
                        self.buffer.hold()
                        continue
                    said.add(output)
                    if checkpoint is not None:
                        checkpoint.record(output)
                    output, resumed = resumed.pass_on(output, self.state.metrics)
                    self.buffer.push(resampler.process(output.audio))
                    if output.finished:
                        self.buffer.push(resampler.flush())
                        self.buffer.end()
                        reason = output.finish_reason.value if output.finish_reason else "eos"
                        if text is not None and output.finish_reason is FinishReason.EOS:
                            reason = text.end_reason
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
            if text is not None:
                stats |= {
                    "segments": len(text.segments),
                    "text_wait_ms": round(self.buffer.stats.text_wait_ms),
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

    async def _close_when_idle(self) -> None:
        """Tell a connected peer ``idle_timeout`` and close it once it has sent no control
        message while nothing played for ``server.webrtc_idle_timeout_s`` (the session's
        rule: no limit while an utterance plays)."""
        while True:
            limit = self.session.idle_timeout_s()
            if limit is None:  # an utterance plays: look again after a whole limit at most
                await asyncio.sleep(self.state.config.server.webrtc_idle_timeout_s)
                continue
            left = self._active_at + limit - time.monotonic()
            if left <= 0:
                log.info("closing a WebRTC peer idle for %.0f s", limit)
                await self._execute(self.session.timed_out())
                return
            await asyncio.sleep(left)

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
