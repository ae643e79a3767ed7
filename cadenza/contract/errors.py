"""How a stream can fail between the edge and the engine.

The engine refuses a request it cannot take with :class:`RequestRejected` (it never started:
unknown voice, duplicate id, too large, queue full); the request's final output then carries
``error_code = "rejected"``. A request that fails inside the model ends with ``"internal"``.
On the edge every such ending surfaces as :class:`EngineError`; a missing engine (starting,
stopped, crashed) as :class:`EngineUnavailable`, which says when to retry.
"""

from __future__ import annotations

from typing import Literal

EngineErrorCode = Literal["rejected", "internal", "unavailable", "slow_consumer", "shutting_down"]

ENGINE_RETRY_AFTER_S = 5.0  # an engine that is starting or restarting is back within seconds


class RequestRejected(ValueError):
    """The engine will not take this request; nothing about it changed the engine's state."""


class EngineError(RuntimeError):
    """A stream could not be served. ``code``: ``rejected`` (the engine refused the request),
    ``internal`` (it failed inside the engine), ``unavailable`` (no engine), ``slow_consumer``
    (the client fell too far behind and was cut off), ``shutting_down`` (the server drained
    and the stream ran past its drain timeout)."""

    def __init__(self, message: str, code: EngineErrorCode) -> None:
        super().__init__(message)
        self.code: EngineErrorCode = code


class EngineUnavailable(EngineError):
    """No engine can take work now; ``retry_after_s`` estimates when one will."""

    def __init__(self, message: str, retry_after_s: float = ENGINE_RETRY_AFTER_S) -> None:
        super().__init__(message, "unavailable")
        self.retry_after_s = retry_after_s
