"""One admission sequence and one stream lifecycle, for HTTP, WebSocket and WebRTC alike.

Every transport authenticates its client its own way (a header, a ``hello``, the offer), then
hands a request to :meth:`Admission.open`, which runs the same steps in the same order::

    engine ready -> validate -> guard -> charge the rate limits -> wait for a slot
                  (each refusal raises EdgeError; a refusal after the charge refunds it)

and returns a :class:`StreamLease`. The transport iterates :meth:`StreamLease.outputs` and
closes the lease when it is done with the stream, however that happens::

    lease = await admission.open(...)
    try:
        async for output in lease.outputs():
            ...                                 # encode and send
    finally:
        lease.close()

The lease ends when the engine is done with the stream (its last output or its failure) or when
the transport closes it first (a cancel, a client that left). Ending settles the audio-seconds
bucket with the audio the engine produced, frees the slot and counts the stream, the same way
on every transport; ``close`` after that is a no-op.
"""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator
from typing import Literal

from cadenza.config import CadenzaConfig
from cadenza.contract.errors import EngineError
from cadenza.contract.request import StreamOutput, SynthesisRequest
from cadenza.contract.stream_length import request_duration_s
from cadenza.edge.admission.gate import AdmissionGate, AdmissionRefused, QueuedCallback, Ticket
from cadenza.edge.admission.guard import TextGuard, run_guard
from cadenza.edge.admission.priority_queues import Priority
from cadenza.edge.admission.rate_limit import Grant, RateLimited, RateLimiter
from cadenza.edge.admission.validation import InvalidRequest, validate_synthesis
from cadenza.edge.errors import EdgeError
from cadenza.edge.metrics import Metrics
from cadenza.ipc.engine_client import EngineClient

Transport = Literal["http", "websocket", "webrtc"]


class Admission:
    def __init__(
        self,
        config: CadenzaConfig,
        engine: EngineClient,
        gate: AdmissionGate,
        rate_limiter: RateLimiter,
        guard: TextGuard | None,
        metrics: Metrics,
    ) -> None:
        self.config = config
        self.engine = engine
        self.gate = gate
        self.rate_limiter = rate_limiter
        self.guard = guard
        self.metrics = metrics

    async def open(
        self,
        *,
        transport: Transport,
        client: str,
        request: SynthesisRequest,
        priority: Priority,
        model: str | None = None,
        on_queued: QueuedCallback | None = None,
    ) -> StreamLease:
        """Admit ``request`` for ``client`` (``model``: the name the client asked for, ``None``
        when its protocol names none). Raises :class:`EdgeError` with the refusal."""
        self.metrics.stream_requests.labels(transport=transport).inc()
        try:
            return await self._open(transport, client, request, priority, model, on_queued)
        except EdgeError as exc:
            self.metrics.stream_refusals.labels(transport=transport, code=exc.code).inc()
            raise

    async def _open(
        self,
        transport: Transport,
        client: str,
        request: SynthesisRequest,
        priority: Priority,
        model: str | None,
        on_queued: QueuedCallback | None,
    ) -> StreamLease:
        try:
            info = self.engine.require_ready()
        except EngineError as exc:
            raise EdgeError.from_engine(exc) from exc
        try:
            validate_synthesis(
                model=info.model_name if model is None else model,
                text=request.text,
                voice=request.voice,
                max_duration_s=request.max_duration_s,
                served_model=info.model_name,
                voices=info.voices,
                limits=self.config.limits,
            )
        except InvalidRequest as exc:
            raise EdgeError.from_invalid(exc) from exc
        verdict = await run_guard(self.guard, request.text, self.config.guard, client)
        if not verdict.allowed:
            reason = verdict.reason or "refused by the input guard"
            raise EdgeError(400, reason, code="content_refused", param="input")
        audio_s = request_duration_s(request.text, request.max_duration_s, self.config.limits)
        try:
            grant = self.rate_limiter.admit(client, audio_s)
        except RateLimited as exc:
            raise EdgeError.from_rate_limit(exc) from exc
        prompt_s = request.prompt_audio_samples / request.prompt_sample_rate
        cost = self.gate.capacity.stream_cost(request.text, audio_s, prompt_s)
        try:
            ticket = await self.gate.acquire(priority, cost, on_queued)
        except AdmissionRefused as exc:
            self.rate_limiter.refund(grant)
            raise EdgeError.from_refusal(exc) from exc
        except BaseException:
            self.rate_limiter.refund(grant)
            raise
        return StreamLease(self, transport, request, grant, ticket, info.sample_rate)


class StreamLease:
    """One admitted stream (see the module docstring). ``queued_s``: how long it waited for
    its slot; ``audio_s``: seconds of audio the engine has produced for it so far."""

    def __init__(
        self,
        admission: Admission,
        transport: Transport,
        request: SynthesisRequest,
        grant: Grant,
        ticket: Ticket,
        sample_rate: int,
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
        self._started = time.perf_counter()
        self._first_audio = False
        admission.metrics.streams_active.inc()

    async def outputs(self) -> AsyncGenerator[StreamOutput, None]:
        """The engine's outputs for this stream, up to its last. Raises :class:`EdgeError`
        when it fails (``engine_*`` codes, or ``slow_consumer``)."""
        metrics = self.admission.metrics
        generator = self.admission.engine.generate(self.request)
        try:
            async for output in generator:
                seconds = len(output.audio) / self.sample_rate
                if not self._first_audio and (seconds > 0 or output.finished):
                    self._first_audio = True
                    metrics.time_to_first_audio.labels(transport=self.transport).observe(
                        time.perf_counter() - self._started
                    )
                self.audio_s += seconds
                metrics.audio_seconds.labels(transport=self.transport).inc(seconds)
                if output.finish_reason is not None:
                    self._end(output.finish_reason.value)
                yield output
        except EngineError as exc:
            self._end("error")
            raise EdgeError.from_engine(exc) from exc
        finally:
            await generator.aclose()  # aborts the engine request if it did not finish

    def close(self) -> None:
        """The transport is done with the stream; if the engine was not, it was cancelled."""
        self._end("cancelled")

    def _end(self, reason: str) -> None:
        if self.ended:
            return
        self.ended = True
        admission = self.admission
        admission.rate_limiter.settle(self._grant, self.audio_s)
        admission.gate.release(self._ticket)
        admission.metrics.streams_active.dec()
        admission.metrics.streams_finished.labels(reason=reason, transport=self.transport).inc()
