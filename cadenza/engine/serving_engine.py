"""What the engine process's loop (:mod:`cadenza.ipc.engine_side.engine_loop`) needs from an
engine: the batching engine and the naive baseline implement it, and the loop reads nothing else
(idle probes go through :func:`cadenza.engine.realtime.probe.probe_engine`)."""

from __future__ import annotations

from typing import Protocol

from cadenza.contract.engine_info import EngineInfo
from cadenza.contract.engine_stats import EngineStats, StepReport
from cadenza.contract.request import StreamOutput, SynthesisRequest


class ServingEngine(Protocol):
    @property
    def info(self) -> EngineInfo:
        """The model's identity and capacity, as announced in ``ready``."""
        ...

    def add_request(self, request: SynthesisRequest) -> None:
        """Queue a stream. Raises :class:`~cadenza.contract.errors.RequestRejected` (or
        ``ValueError``) without changing any state."""
        ...

    def abort_request(self, request_id: str) -> bool:
        """Stop a stream; its final output (``CANCELLED``) comes from the next :meth:`step`.
        ``False`` when the request is unknown or already finished."""
        ...

    def has_unfinished_requests(self) -> bool: ...

    def idle_s(self) -> float:
        """How long the engine may wait before its next step without any stream needing it
        (0: step now). Every stream far enough ahead of its listener can wait; the CPU is
        then left to the rest of the machine (the edge encoding and sending its audio)."""
        ...

    def step(self) -> list[StreamOutput]:
        """Advance every stream by one step; the outputs ready now (audio chunks, endings)."""
        ...

    def stats(self) -> EngineStats: ...

    def take_report(self) -> StepReport:
        """Every step and delivered chunk since the last call (and forget them)."""
        ...
