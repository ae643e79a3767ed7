"""A WebRTC client (aiortc) that talks to the server as the browser page does: it posts an
offer, receives the audio track and speaks the control protocol on the ``control`` channel.
The load-test harness and the tests use it; it keeps every received frame's samples."""

from __future__ import annotations

import asyncio
import contextlib
import json
from dataclasses import dataclass, field
from typing import Any

import httpx
import numpy as np
from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription
from aiortc.mediastreams import MediaStreamError


@dataclass
class ReceivedAudio:
    events: list[dict[str, Any]] = field(default_factory=list)
    samples: list[np.ndarray] = field(default_factory=list)

    def loud_samples(self) -> int:
        """Received 16-bit samples louder than -50 dBFS (silence frames do not count)."""
        return int(sum((np.abs(s) > 100).sum() for s in self.samples))


class WebRTCPeer:
    def __init__(
        self,
        base_url: str,
        microphone: Any = None,
        api_key: str | None = None,
        configuration: RTCConfiguration | None = None,
    ) -> None:
        """``microphone``: an audio ``MediaStreamTrack`` to send (none: receive only);
        ``configuration``: ICE servers and policy (e.g. the server's TURN relay, relayed
        candidates only), as ``GET /v1/webrtc/config`` names the servers."""
        self.base_url = base_url
        self.api_key = api_key
        self.configuration = configuration
        self.microphone = microphone
        self.node: str | None = None  # the node that answered the offer (x-cadenza-node)
        self.result = ReceivedAudio()
        self.resumes = 0  # utterances resumed on another node after theirs went silent
        self._reader: asyncio.Task[None] | None = None
        self._new_connection()

    def _new_connection(self) -> None:
        self.pc = RTCPeerConnection(self.configuration)
        self.channel = self.pc.createDataChannel("control")
        self._events: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self._opened = asyncio.Event()
        self.channel.on("open", self._opened.set)
        self.channel.on("message", lambda m: self._events.put_nowait(json.loads(m)))
        if self.microphone is None:
            self.pc.addTransceiver("audio", direction="recvonly")
        else:
            self.pc.addTrack(self.microphone)
        self.pc.on("track", self._on_track)

    def _on_track(self, track: Any) -> None:
        async def read() -> None:
            try:
                while True:
                    frame = await track.recv()
                    self.result.samples.append(frame.to_ndarray().reshape(-1))
            except MediaStreamError:
                pass

        self._reader = asyncio.ensure_future(read())

    async def connect(self) -> None:
        """Offer, answer, and wait for the control channel to open."""
        await self.pc.setLocalDescription(await self.pc.createOffer())
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        async with httpx.AsyncClient(timeout=30) as client:
            response = await client.post(
                f"{self.base_url}/v1/webrtc/offer",
                json={"sdp": self.pc.localDescription.sdp, "type": "offer"},
                headers=headers,
            )
        response.raise_for_status()
        self.node = response.headers.get("x-cadenza-node")
        answer = response.json()
        await self.pc.setRemoteDescription(RTCSessionDescription(answer["sdp"], answer["type"]))
        await asyncio.wait_for(self._opened.wait(), 20)

    def send(self, message: dict[str, Any]) -> None:
        self.channel.send(json.dumps(message))

    async def next_event(self, kinds: set[str], timeout_s: float = 30) -> dict[str, Any]:
        """The next control message of one of ``kinds`` (others are kept in ``result``)."""
        while True:
            event = await asyncio.wait_for(self._events.get(), timeout_s)
            self.result.events.append(event)
            if event["type"] in kinds:
                return event

    async def speak(
        self, message: dict[str, Any], timeout_s: float = 60.0, silence_s: float = 2.0
    ) -> dict[str, Any]:
        """Send ``speak`` and return its ``done`` (or ``error``). While it plays the server
        reports its position every half second; when nothing arrives for ``silence_s`` and
        the utterance has a ``resume_token`` (servers with stream checkpoints), its node is
        taken for lost: a new offer goes to ``base_url`` (the front door, so another node),
        and the utterance resumes from what the track had played."""
        self.send(message)
        deadline = asyncio.get_running_loop().time() + timeout_s
        token: str | None = None
        played = 0
        while True:
            left = deadline - asyncio.get_running_loop().time()
            try:
                event = await self.next_event(
                    {"started", "stats", "done", "error"}, min(silence_s, max(left, 0.01))
                )
            except TimeoutError:
                if token is None or left <= 0:
                    raise
                await self._reconnect()
                self.send({"type": "resume", "token": token, "samples_heard": played})
                self.resumes += 1
                continue
            if event["type"] in ("done", "error"):
                return event
            if event["type"] == "started":
                token = event.get("resume_token")
            elif event.get("played_samples") is not None:
                played = int(event["played_samples"])

    async def _reconnect(self, within_s: float = 20.0) -> None:
        """A new peer connection through ``base_url``, the old one dropped; offers again
        with backoff while the front door has no node to answer (503, refused)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within_s
        delay = 0.25
        while True:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.pc.close(), 2.0)
            if self._reader is not None:
                self._reader.cancel()
            self._new_connection()
            try:
                await self.connect()
                return
            except (httpx.HTTPError, TimeoutError):
                if loop.time() + delay > deadline:
                    raise
                await asyncio.sleep(delay)
                delay = min(2 * delay, 2.0)

    async def close(self) -> None:
        if self._reader is not None:
            self._reader.cancel()
        await self.pc.close()
