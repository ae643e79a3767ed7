"""Resuming a stream another node started and lost, for the WebSocket and WebRTC alike: claim
its checkpoint (:mod:`cadenza.edge.streams.checkpoints`), admit it here ahead of new streams,
and say where its audio goes on and how much of the continuation the client already has.

::

    claimed = await claim_and_admit(state, resume, principal, "websocket", heard_rate)
    resumed = claimed.resumed
    async for output in claimed.lease.outputs():
        output, resumed = resumed.pass_on(output, metrics)
        ...send output...

A refusal raises :class:`EdgeError` with the documented code (``resume_not_found``,
``resume_taken``, ``resume_forbidden``, ``resume_live``, ``resume_invalid``,
``resume_unavailable``, or admission's own); a claim
that admission then refuses is put back, so the client may try again elsewhere. The outcome is
counted in ``cadenza_node_resumes_total``.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from cadenza.contract.engine_info import EngineInfo
from cadenza.contract.request import StreamOutput
from cadenza.edge.auth.principal import Principal
from cadenza.edge.server.metrics import Metrics
from cadenza.edge.streams.checkpoints import Boundary, ResumeRefused, StreamHead, resume_point
from cadenza.edge.streams.errors import EdgeError
from cadenza.edge.streams.lease import StreamLease, Transport
from cadenza.edge.streams.protocol import Resume

if TYPE_CHECKING:
    from cadenza.edge.server.state import EdgeState


@dataclass(frozen=True)
class Resumed:
    """Where a stream stands when it starts on this node: the ``rows`` generated before (none
    for a new stream), the output boundary ``at`` which the engine goes on, the ``drop``
    samples or frames (``unit``) of the continuation the client already has, and when the
    lost node last wrote (wall clock; ``None`` for a new stream, and once the continuation's
    first audio is out)."""

    rows: np.ndarray | None
    at: Boundary
    drop: int
    unit: str
    last_write: float | None

    @classmethod
    def fresh(cls) -> Resumed:
        """A stream that starts here."""
        return cls(None, Boundary(0, 0), 0, "samples", None)

    def pass_on(self, output: StreamOutput, metrics: Metrics) -> tuple[StreamOutput, Resumed]:
        """``output`` without what the client already has, and where the stream stands after
        it. The continuation's first audio observes the gap since the lost node's last write
        (``cadenza_node_resume_gap_seconds``)."""
        resumed = self
        if self.last_write is not None and (len(output.audio) or output.finished):
            metrics.node_resume_gap.observe(max(time.time() - self.last_write, 0.0))
            resumed = dataclasses.replace(self, last_write=None)
        return resumed._trim(output)

    def _trim(self, output: StreamOutput) -> tuple[StreamOutput, Resumed]:
        if not self.drop:
            return output, self
        if self.unit == "frames":
            codes = output.codes
            if codes is None:
                return output, self
            taken = min(self.drop, len(codes))
            output = dataclasses.replace(output, codes=codes[taken:])
        else:
            taken = min(self.drop, len(output.audio))
            output = dataclasses.replace(output, audio=output.audio[taken:])
        return output, dataclasses.replace(self, drop=self.drop - taken)


@dataclass(frozen=True)
class Claimed:
    """A resumed stream admitted here."""

    lease: StreamLease
    info: EngineInfo
    head: StreamHead
    resumed: Resumed


async def claim_and_admit(
    state: EdgeState,
    resume: Resume,
    principal: Principal,
    transport: Transport,
    heard_rate: int | None = None,
) -> Claimed:
    """Claim the checkpoint ``resume`` names for ``principal`` (its stream must be the same
    client's, and its model within a client token's scope) and admit its stream here.
    ``heard_rate``: the rate the client counts ``samples_heard`` at when it is not the
    stream's own (WebRTC: the track's 48 kHz). Raises :class:`EdgeError`."""
    store, resumes = state.checkpoints, state.metrics.node_resumes
    if store is None:
        message = (
            "this server keeps no stream checkpoints (limits.redis_url or auth.token_secret "
            "is not set)"
        )
        raise EdgeError(503, message, code="resume_unavailable")
    try:
        checkpoint = await store.claim(resume.token, principal.client)
    except ResumeRefused as exc:
        resumes.labels(outcome="expired" if exc.code == "resume_not_found" else "refused").inc()
        raise EdgeError(exc.status, exc.message, code=exc.code) from exc
    head = checkpoint.head
    try:
        service = state.service(head.model, transport=transport)
        info = service.info()
        limits = state.config.limits
        if principal.scoped(service.name, head.request, limits, info.default_duration_s) != (
            head.request
        ):
            raise EdgeError(
                403,
                "this client token allows less audio per stream than the stream to resume",
                code="audio_not_allowed",
            )
        unit, heard = _heard(resume, head, info.sample_rate, heard_rate)
        point, at, drop = resume_point(checkpoint, heard, unit)
        lease = await service.admission.resume(
            transport=transport,
            principal=principal,
            request=head.request,
            priority=head.priority,
            rows=checkpoint.rows,
            frames_heard=point.frames_sent,
        )
    except EdgeError:
        store.restore(resume.token, checkpoint)  # the client may try again
        resumes.labels(outcome="refused").inc()
        raise
    resumes.labels(outcome="resumed").inc()
    return Claimed(
        lease, info, head, Resumed(checkpoint.rows, at, drop, unit, checkpoint.last_write)
    )


def _heard(
    resume: Resume, head: StreamHead, codec_rate: int, heard_rate: int | None
) -> tuple[str, int]:
    """What the client heard, in codec frames (``encodec``) or samples at the codec's rate.
    Raises :class:`EdgeError` ``invalid_message`` when it gave the other measure."""
    if head.format == "encodec" and heard_rate is None:
        if resume.frames_heard is None:
            message = "resume: an encodec stream counts frames_heard"
            raise EdgeError(400, message, code="invalid_message")
        return "frames", resume.frames_heard
    if resume.samples_heard is None:
        message = f"resume: a {head.format} stream counts samples_heard"
        raise EdgeError(400, message, code="invalid_message")
    rate = heard_rate or head.sample_rate
    return "samples", round(resume.samples_heard * codec_rate / rate)
