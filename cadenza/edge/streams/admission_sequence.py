"""One admission sequence, for HTTP, WebSocket and WebRTC alike.

Every transport authenticates its client its own way (a header, a ``hello``, the offer) into a
:class:`~cadenza.edge.auth.principal.Principal`, then hands a request to
:meth:`Admission.open`, which runs the same steps in the same order::

    open -> engine ready -> scope -> validate -> count the holder's streams -> guard
         -> charge the rate limits -> wait for a slot
    (each refusal raises EdgeError; a refusal after the count or the charge gives it back)

and returns a :class:`~cadenza.edge.streams.lease.StreamLease`, the stream's lifecycle, which
holds the stream's place in its holder's count
(:mod:`~cadenza.edge.admission.client_streams`) until it ends.
:meth:`Admission.resume` admits a stream another node lost; :meth:`Admission.check_segment`
checks each segment of a text stream as a whole text is checked.
"""

from __future__ import annotations

import dataclasses
from typing import Protocol

import numpy as np

from cadenza.config import CadenzaConfig
from cadenza.contract.engine_info import EngineInfo
from cadenza.contract.errors import EngineError
from cadenza.contract.request import (
    ContextTurn,
    SynthesisRequest,
)
from cadenza.contract.stream_length import request_duration_s
from cadenza.edge.admission.capacity import StreamCost
from cadenza.edge.admission.client_streams import (
    ClientStreams,
    NodeStreams,
    StreamSlot,
    TooManyStreams,
)
from cadenza.edge.admission.gate import AdmissionGate
from cadenza.edge.admission.guard import TextGuard, run_guard
from cadenza.edge.admission.priority_queues import Priority
from cadenza.edge.admission.rate_limit import Grant, Quotas, QuotasUnavailable, RateLimited
from cadenza.edge.admission.ticket import AdmissionRefused, QueuedCallback
from cadenza.edge.admission.validation import InvalidRequest, validate_synthesis
from cadenza.edge.auth.principal import Principal
from cadenza.edge.server.lifecycle import Lifecycle
from cadenza.edge.server.metrics import Metrics
from cadenza.edge.server.model_metrics import ModelMetrics
from cadenza.edge.streams.errors import EdgeError
from cadenza.edge.streams.lease import StreamLease, Transport
from cadenza.ipc.edge_side.engine_client import EngineClient


class StreamEngines(Protocol):
    """What a lease needs from its model's engines (the model service)."""

    def require_ready(self) -> EngineInfo:
        """Raises :class:`EngineUnavailable` unless some engine can take work."""
        ...

    def client_for(self, replica: int | None) -> EngineClient:
        """The engine client of ``replica``; raises :class:`EngineUnavailable`."""
        ...


class Admission:
    def __init__(
        self,
        config: CadenzaConfig,
        engines: StreamEngines,
        gate: AdmissionGate,
        rate_limiter: Quotas,
        guard: TextGuard | None,
        metrics: Metrics,
        *,
        lifecycle: Lifecycle | None = None,
        model_metrics: ModelMetrics | None = None,
        client_streams: ClientStreams | None = None,
    ) -> None:
        """``client_streams``: the node's count of open streams per holder, shared by every
        model it serves (default: one of this admission's own)."""
        self.config = config
        self.engines = engines
        self.gate = gate
        self.rate_limiter = rate_limiter
        self.guard = guard
        self.metrics = metrics
        self.lifecycle = lifecycle or Lifecycle()
        self.model_metrics = model_metrics or gate.metrics
        if client_streams is None:
            client_streams = NodeStreams(config.limits.max_streams_per_client)
        self.client_streams = client_streams

    async def open(
        self,
        *,
        transport: Transport,
        principal: Principal,
        request: SynthesisRequest,
        priority: Priority,
        model: str | None = None,
        on_queued: QueuedCallback | None = None,
        text_stream: bool = False,
    ) -> StreamLease:
        """Admit ``request`` for ``principal`` (``model``: the name the client asked for,
        ``None`` when its protocol names none), within its scope (a client token's models
        and audio per stream: :meth:`Principal.scoped`). ``text_stream``: its text is still
        arriving (its ``text`` is the first piece, possibly empty); it weighs what its
        longest segment weighs, with as many earlier segments as context as a model that takes
        context gets (:mod:`cadenza.edge.streams.text_stream`), and each segment passes
        :meth:`check_segment` before it is spoken. Raises :class:`EdgeError` with the
        refusal."""
        self.metrics.stream_requests.labels(transport=transport).inc()
        try:
            return await self._open(
                transport, principal, request, priority, model, on_queued, text_stream
            )
        except EdgeError as exc:
            self.metrics.stream_refusals.labels(transport=transport, code=exc.code).inc()
            raise

    async def _open(
        self,
        transport: Transport,
        principal: Principal,
        request: SynthesisRequest,
        priority: Priority,
        model: str | None,
        on_queued: QueuedCallback | None,
        text_stream: bool,
    ) -> StreamLease:
        self.lifecycle.check_open()
        try:
            info = self.engines.require_ready()
        except EngineError as exc:
            raise EdgeError.from_engine(exc) from exc
        client = principal.client
        request = principal.scoped(
            info.model_name, request, self.config.limits, info.default_duration_s
        )
        try:
            validate_synthesis(
                model=info.model_name if model is None else model,
                text=request.text,
                voice=request.voice,
                max_duration_s=request.max_duration_s,
                served_model=info.model_name,
                voices=info.voices,
                limits=self.config.limits,
                text_to_come=text_stream,
                sampling=request.sampling,
                sampling_fields=info.sampling_fields,
            )
        except InvalidRequest as exc:
            raise EdgeError.from_invalid(exc) from exc
        slot = await self._count_stream(principal.holder, request.request_id)
        try:
            if request.text.strip():
                await self._guard(request.text, client)
            sized, context_segments = request, 0
            if text_stream:
                sized, context_segments = self._longest_segment(request, info)
            audio_s = request_duration_s(
                sized.text, sized.max_duration_s, self.config.limits, info.default_duration_s
            )
            try:
                grant = await self.rate_limiter.acquire(client, audio_s)
            except RateLimited as exc:
                raise EdgeError.from_rate_limit(exc) from exc
            except QuotasUnavailable as exc:
                raise EdgeError.from_quotas_unavailable(exc) from exc
            cost = self._cost(sized, info, audio_s, audio_s * context_segments)
            try:
                ticket = await self.gate.acquire(priority, cost, on_queued, prefix=request.voice)
            except AdmissionRefused as exc:
                self.rate_limiter.refund(grant)
                raise EdgeError.from_refusal(exc) from exc
            except BaseException:
                self.rate_limiter.refund(grant)
                raise
        except BaseException:
            self.client_streams.release(slot)
            raise
        return StreamLease(self, transport, request, grant, ticket, info.sample_rate, slot)

    async def _count_stream(self, holder: str, stream_id: str) -> StreamSlot:
        """Count the stream among ``holder``'s open ones: 429 ``too_many_streams`` over
        ``limits.max_streams_per_client``, 503 ``quota_unavailable`` when the fleet's count
        cannot be read and ``limits.redis_failure = "closed"``."""
        try:
            return await self.client_streams.acquire(holder, stream_id)
        except TooManyStreams as exc:
            raise EdgeError(429, str(exc), code="too_many_streams") from exc
        except QuotasUnavailable as exc:
            raise EdgeError.from_quotas_unavailable(exc) from exc

    async def check_segment(self, text: str, client: str) -> None:
        """A text stream's segment may be spoken: its length and the input guard, as a whole
        text's. Raises :class:`EdgeError`."""
        limit = self.config.limits.max_input_chars
        if len(text) > limit:
            message = f"a segment is {len(text)} characters; the limit is {limit}"
            raise EdgeError(400, message, code="input_too_long", param="text")
        await self._guard(text, client)

    async def _guard(self, text: str, client: str) -> None:
        verdict = await run_guard(self.guard, text, self.config.guard, client)
        if not verdict.allowed:
            reason = verdict.reason or "refused by the input guard"
            raise EdgeError(400, reason, code="content_refused", param="input")

    def _longest_segment(
        self, request: SynthesisRequest, info: EngineInfo
    ) -> tuple[SynthesisRequest, int]:
        """What a text stream weighs: its longest segment, after the most earlier segments a
        model that takes context hears (their text in the request, their audio counted by the
        second value: how many segments of audio)."""
        config = self.config.text_stream
        segment = "x" * config.segment_max_chars
        turns = config.context_segments if info.takes_context else 0
        context = tuple(ContextTurn(voice=request.voice, text=segment) for _ in range(turns))
        return dataclasses.replace(request, text=segment, context=request.context + context), turns

    async def resume(
        self,
        *,
        transport: Transport,
        principal: Principal,
        request: SynthesisRequest,
        priority: Priority,
        rows: np.ndarray,
        frames_heard: int,
    ) -> StreamLease:
        """Admit a stream that another node started and lost, which its client
        (``principal``) resumes here from its checkpoint: ``rows`` generated there,
        ``frames_heard`` of them heard. It is not validated, guarded or charged again (its
        first node did all that) but counted among its holder's open streams (once: it keeps
        its request id); it is placed ahead of new streams, as a stream whose engine was lost
        is, within ``server.resume_timeout_s``. Raises :class:`EdgeError`."""
        self.metrics.stream_requests.labels(transport=transport).inc()
        try:
            self.lifecycle.check_open()
            try:
                info = self.engines.require_ready()
            except EngineError as exc:
                raise EdgeError.from_engine(exc) from exc
            total_s = request_duration_s(
                request.text, request.max_duration_s, self.config.limits, info.default_duration_s
            )
            heard_s = frames_heard / info.frame_rate
            cost = self._cost(request, info, max(total_s - heard_s, 0.0), heard_s)
            slot = await self._count_stream(principal.holder, request.request_id)
            try:
                ticket = await self.gate.admit_resumed(
                    priority, cost, self.config.server.resume_timeout_s
                )
            except BaseException as exc:
                self.client_streams.release(slot)
                if isinstance(exc, AdmissionRefused):
                    raise EdgeError.from_refusal(exc) from exc
                raise
        except EdgeError as exc:
            self.metrics.stream_refusals.labels(transport=transport, code=exc.code).inc()
            raise
        grant = Grant(principal.client, 0.0)
        lease = StreamLease(self, transport, request, grant, ticket, info.sample_rate, slot)
        lease.seed(rows, frames_heard)
        return lease

    def _cost(
        self, request: SynthesisRequest, info: EngineInfo, audio_s: float, heard_s: float = 0.0
    ) -> StreamCost:
        """What the stream weighs in admission: its prompt (text, speech prompt, context, and
        ``heard_s`` of audio already generated, which a resume prefills) and ``audio_s``."""
        prompt_s = request.prompt_audio_samples / request.prompt_sample_rate + heard_s
        prompt_s += request.context_audio_s(info.frame_rate)
        prompt_text = "".join(turn.text for turn in request.context) + request.text
        return self.gate.capacity.stream_cost(prompt_text, audio_s, prompt_s)
