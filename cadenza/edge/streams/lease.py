"""One stream's lifecycle, for HTTP, WebSocket and WebRTC alike: the :class:`StreamLease` that
:meth:`Admission.open <cadenza.edge.streams.admission_sequence.Admission.open>` returns.

The transport iterates :meth:`StreamLease.outputs` and closes the lease when it is done with
the stream, however that happens::

    lease = await admission.open(...)
    try:
        async for output in lease.outputs():
            ...                                 # encode and send
    finally:
        lease.close()

The lease ends when the engine is done with the stream (its last output or its failure) or when
the transport closes it first (a cancel, a client that left). Ending settles the audio-seconds
bucket with the audio the engine produced, frees the slot, takes the stream out of its holder's
open streams (``limits.max_streams_per_client``) and counts it, the same way on every
transport; ``close`` after that is a no-op. A text stream's lease carries one request after
another (:meth:`StreamLease.speak_next`) and ends with :meth:`StreamLease.finish`.

A stream survives the loss of its engine replica: the lease keeps the rows each output carries
and the codec frames its listener has had, and when the replica is lost it asks the gate for
another (ahead of every waiter, for up to ``server.resume_timeout_s``) and sends the same
request there with a :class:`ResumePoint`. The listener hears a gap, then the same utterance
going on; the transport sees nothing but a late chunk. A draining server
(:class:`~cadenza.edge.server.lifecycle.Lifecycle`) refuses new streams and may end open ones with
``shutting_down``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import AsyncGenerator
from typing import TYPE_CHECKING, Literal

import numpy as np

from cadenza.contract.errors import ENGINE_RETRY_AFTER_S, EngineError, EngineUnavailable
from cadenza.contract.request import (
    FinishReason,
    ResumePoint,
    StreamOutput,
    SynthesisRequest,
)
from cadenza.contract.stream_length import request_duration_s
from cadenza.edge.admission.client_streams import StreamSlot
from cadenza.edge.admission.rate_limit import Grant, QuotasUnavailable, RateLimited
from cadenza.edge.admission.ticket import AdmissionRefused, Ticket
from cadenza.edge.streams.errors import EdgeError
from cadenza.ipc.edge_side.engine_client import EngineClient

if TYPE_CHECKING:
    from cadenza.edge.streams.admission_sequence import Admission

Transport = Literal["http", "websocket", "webrtc"]

_SEGMENT_ENDS = (FinishReason.EOS, FinishReason.LENGTH)  # a text stream's segment, not it
_MAX_RESUMES = 8  # engine losses one stream may survive
_LOSS_NOTICE_S = 1.0  # how long a stream failed as unavailable waits for its engine's loss


class StreamLease:
    """One admitted stream (see the module docstring). ``queued_s``: how long it waited for
    its slot; ``audio_s``: seconds of audio the engine has produced for it so far. ``slot``:
    its place among its holder's open streams, given back when it ends."""

    def __init__(
        self,
        admission: Admission,
        transport: Transport,
        request: SynthesisRequest,
        grant: Grant,
        ticket: Ticket,
        sample_rate: int,
        slot: StreamSlot,
    ) -> None:
        self.admission = admission
        self.transport = transport
        self.request = request
        self.sample_rate = sample_rate
        self.queued_s = ticket.waited_s
        self.audio_s = 0.0
        self.ended = False
        self._grant = grant
        self._ticket = ticket
        self._slot = slot
        self._started = time.perf_counter()
        self._first_audio = False
        self._rows: list[np.ndarray] = []  # what the engine generated, as its outputs carried
        self._frames_heard = 0
        self._client: EngineClient | None = None
        self._lost_at: float | None = None  # when its engine was lost, until audio is back
        self._cut: str | None = None  # why a drain ended it
        self.resumes = 0
        self.segmented = False  # a text stream: its requests follow each other (speak_next)
        self._segments = 0  # a text stream's segments charged so far
        admission.metrics.streams_active.inc()
        admission.lifecycle.opened(self)

    def seed(self, rows: np.ndarray, frames_heard: int) -> None:
        """Where a stream resumed from another node's checkpoint stands: the engine goes on
        after ``rows``, its listener having heard ``frames_heard`` frames."""
        self._rows = [rows] if len(rows) else []
        self._frames_heard = frames_heard

    def speak_next(self, request: SynthesisRequest) -> None:
        """A text stream's next segment (:mod:`cadenza.edge.streams.text_stream`): the next
        :meth:`outputs` are ``request``'s. The lease then outlives each request that ends by
        itself (``eos``, ``length``) until :meth:`finish`; call it only between segments."""
        if self.ended:
            raise EdgeError(409, "the stream has ended", code="stream_ended")
        self.segmented = True
        if not self._first_audio:  # TTFA counts from the first segment, not from its text
            self._started = time.perf_counter()
        self.request = request
        self._rows = []
        self._frames_heard = 0

    async def charge_segment(self, text: str) -> None:
        """Charge a text stream's next segment to its client's audio-seconds bucket (its first
        was charged at admission, as the longest segment); the stream's audio is settled once,
        at its end. Raises :class:`EdgeError` ``rate_limited`` (the stream then ends)."""
        self._segments += 1
        if self._segments == 1:
            return
        limits = self.admission.config.limits
        audio_s = request_duration_s(text, self.request.max_duration_s, limits)
        try:
            await self.admission.rate_limiter.acquire(self._grant.client, audio_s, requests=0)
        except RateLimited as exc:
            raise EdgeError.from_rate_limit(exc) from exc
        except QuotasUnavailable as exc:
            raise EdgeError.from_quotas_unavailable(exc) from exc
        self._grant.audio_s += audio_s

    def finish(self, reason: str) -> None:
        """A text stream said everything it will say (``reason``: ``eos``, ``text_timeout``)."""
        self._end(reason)

    async def outputs(self) -> AsyncGenerator[StreamOutput, None]:
        """The engine's outputs for this stream, up to its last, across engine losses (see
        the module docstring). Raises :class:`EdgeError` when it fails (``engine_*`` codes,
        ``slow_consumer``, ``shutting_down``)."""
        while True:
            from_engine = self._outputs_from_engine()
            try:
                async for output in from_engine:
                    yield output
                return
            except EngineUnavailable as exc:
                if not await self._should_resume():
                    self._end("error")
                    raise EdgeError.from_engine(exc) from exc
            except EngineError as exc:
                self._end("error" if exc.code != "shutting_down" else "shutting_down")
                if self.resumes and exc.code == "rejected":  # the new engine had no room
                    message = f"the stream lost its engine and could not be resumed: {exc}"
                    raise EdgeError(
                        503,
                        message,
                        code="engine_unavailable",
                        retry_after_s=ENGINE_RETRY_AFTER_S,
                    ) from exc
                raise EdgeError.from_engine(exc) from exc
            finally:
                await from_engine.aclose()  # aborts the engine request if it did not finish
            await self._resume()

    def close(self) -> None:
        """The transport is done with the stream; if the engine was not, it was cancelled."""
        self._end("cancelled")

    @property
    def cut_reason(self) -> str | None:
        """Why a drain ended the stream (``None``: it did not)."""
        return self._cut

    def cut(self, reason: str) -> None:
        """End the stream now (a drain ran out of time): the transport reads
        ``shutting_down`` after what it has been sent."""
        self._cut = reason
        if self._client is not None and not self.ended:
            self._client.end_stream(self.request.request_id, reason, "shutting_down")

    async def _outputs_from_engine(self) -> AsyncGenerator[StreamOutput, None]:
        """One engine's outputs for the stream (the request resumed where it stands)."""
        metrics = self.admission.metrics
        request = self.request
        if self.resumes or self._rows:  # moved, or resumed from another node's checkpoint
            rows = np.concatenate(self._rows) if self._rows else np.zeros((0, 1), np.int32)
            point = ResumePoint(tuple(map(tuple, rows.tolist())), self._frames_heard)
            request = dataclasses.replace(request, resume=point)
        continuing = self._client is not None and self.segmented
        self._client = self.admission.engines.client_for(self._ticket.replica)
        generator = self._client.generate(request, continuing=continuing)
        try:
            async for output in generator:
                seconds = len(output.audio) / self.sample_rate
                if not self._first_audio and (seconds > 0 or output.finished):
                    self._first_audio = True
                    metrics.time_to_first_audio.labels(transport=self.transport).observe(
                        time.perf_counter() - self._started
                    )
                if self._lost_at is not None and (seconds > 0 or output.finished):
                    self.admission.model_metrics.resume_gap.observe(
                        time.perf_counter() - self._lost_at
                    )
                    self._lost_at = None
                if output.rows is not None:
                    self._rows.append(output.rows)
                if output.codes is not None:
                    self._frames_heard += len(output.codes)
                self.audio_s += seconds
                metrics.audio_seconds.labels(transport=self.transport).inc(seconds)
                if output.finish_reason is not None and not (
                    self.segmented and output.finish_reason in _SEGMENT_ENDS
                ):
                    self._end(output.finish_reason.value)
                yield output
        finally:
            await generator.aclose()  # aborts the engine request if it did not finish

    async def _should_resume(self) -> bool:
        """Whether the stream moves to another engine after its engine said it is unavailable:
        resuming is on, the server is not draining, the stream has moves left, and its replica
        was lost (its ticket lost its replica). That is normally so before the stream hears;
        an engine that failed the stream first (it died an instant before its loss was
        noticed) is given ``_LOSS_NOTICE_S`` to be declared lost. One that is still alive then
        (it refused the stream as unavailable) fails it: moving to the same engine again
        would not help."""
        if (
            self.admission.config.server.resume_timeout_s <= 0
            or self.admission.lifecycle.draining
            or self.resumes >= _MAX_RESUMES
            or self.ended
            or self._cut is not None
        ):
            return False
        deadline = time.monotonic() + _LOSS_NOTICE_S
        while self._ticket.replica is not None and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        return self._ticket.replica is None

    async def _resume(self) -> None:
        """Find the stream a replica to go on from; :class:`EdgeError` 503
        ``engine_unavailable`` when none takes it in time."""
        resumes = self.admission.model_metrics.stream_resumes
        if self._lost_at is None:
            self._lost_at = time.perf_counter()
        try:
            await self.admission.gate.relocate(
                self._ticket, self.admission.config.server.resume_timeout_s
            )
        except AdmissionRefused as exc:
            resumes.labels(outcome="failed").inc()
            self._end("error")
            raise EdgeError(
                503, str(exc), code="engine_unavailable", retry_after_s=exc.retry_after_s
            ) from exc
        if self._cut is not None:  # a drain ended the stream while it waited
            self._end("shutting_down")
            raise EdgeError(503, self._cut, code="shutting_down")
        resumes.labels(outcome="resumed").inc()
        self.resumes += 1

    def _end(self, reason: str) -> None:
        if self.ended:
            return
        self.ended = True
        admission = self.admission
        admission.lifecycle.closed(self)
        admission.rate_limiter.settle(self._grant, self.audio_s)
        admission.gate.release(self._ticket)
        admission.client_streams.release(self._slot)
        admission.metrics.streams_active.dec()
        admission.metrics.streams_finished.labels(reason=reason, transport=self.transport).inc()
