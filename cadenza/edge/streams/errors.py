"""One error type for everything the edge refuses or fails, whatever the transport.

An :class:`EdgeError` carries what every transport needs: the documented ``code``, a message,
the HTTP ``status``, the offending ``param`` and, for refusals that will pass, ``retry_after_s``.
HTTP renders it in OpenAI's shape ``{"error": {"message", "type", "param", "code"}}`` with
``Retry-After``; WebSocket and WebRTC send an ``error`` message with the same ``code`` and
``retry_after_s`` (docs/protocol.md lists them all).
"""

from __future__ import annotations

import math

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from cadenza.contract.errors import EngineError, EngineUnavailable
from cadenza.edge.admission.rate_limit import QuotasUnavailable, RateLimited
from cadenza.edge.admission.ticket import AdmissionRefused
from cadenza.edge.admission.validation import InvalidRequest

_ENGINE_STATUS = {
    "rejected": 400,
    "internal": 500,
    "unavailable": 503,
    "slow_consumer": 408,
    "shutting_down": 503,
}
_EDGE_CODES = ("slow_consumer", "shutting_down")  # not prefixed with engine_


class EdgeError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        *,
        code: str,
        param: str | None = None,
        retry_after_s: float | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.param = param
        self.retry_after_s = retry_after_s
        self.headers = dict(headers or {})
        if retry_after_s is not None:
            self.headers["Retry-After"] = str(max(1, math.ceil(retry_after_s)))

    @classmethod
    def from_invalid(cls, exc: InvalidRequest) -> EdgeError:
        return cls(400, exc.message, code=exc.code, param=exc.param)

    @classmethod
    def from_refusal(cls, exc: AdmissionRefused) -> EdgeError:
        """Over capacity: 503 with ``Retry-After``; a request that can never fit: 400."""
        if exc.code == "too_large":
            return cls(400, str(exc), code=exc.code, param="max_duration_s")
        return cls(503, str(exc), code=exc.code, retry_after_s=exc.retry_after_s)

    @classmethod
    def from_rate_limit(cls, exc: RateLimited) -> EdgeError:
        return cls(429, str(exc), code="rate_limited", retry_after_s=exc.retry_after_s)

    @classmethod
    def from_quotas_unavailable(cls, exc: QuotasUnavailable) -> EdgeError:
        """503 ``quota_unavailable`` with ``Retry-After``: the fleet's quotas cannot be read
        and ``limits.redis_failure = "closed"`` says not to admit without them."""
        return cls(503, str(exc), code="quota_unavailable", retry_after_s=exc.retry_after_s)

    @classmethod
    def from_engine(cls, exc: EngineError) -> EdgeError:
        """``engine_rejected`` (400), ``engine_internal`` (500), ``engine_unavailable`` (503,
        with ``Retry-After``), ``slow_consumer``, ``shutting_down`` (503)."""
        retry = exc.retry_after_s if isinstance(exc, EngineUnavailable) else None
        code = exc.code if exc.code in _EDGE_CODES else f"engine_{exc.code}"
        return cls(_ENGINE_STATUS[exc.code], str(exc), code=code, retry_after_s=retry)


def error_type(status: int) -> str:
    if status == 401:
        return "authentication_error"
    if status == 429:
        return "rate_limit_error"
    if status >= 500:
        return "server_error"
    return "invalid_request_error"


def error_response(exc: EdgeError) -> JSONResponse:
    body = {
        "error": {
            "message": exc.message,
            "type": error_type(exc.status),
            "param": exc.param,
            "code": exc.code,
        }
    }
    return JSONResponse(body, status_code=exc.status, headers=exc.headers)


def install_error_handlers(app: FastAPI) -> None:
    """Every error the app returns, including FastAPI's own, takes the OpenAI shape."""

    async def on_edge_error(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, EdgeError)
        return error_response(exc)

    async def on_engine_error(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, EngineError)
        return error_response(EdgeError.from_engine(exc))

    async def on_http_error(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        return error_response(EdgeError(exc.status_code, str(exc.detail), code=code))

    async def on_validation_error(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        first = exc.errors()[0]
        param = ".".join(str(p) for p in first["loc"] if p != "body") or None
        message = f"{param}: {first['msg']}"
        return error_response(EdgeError(400, message, code="invalid_value", param=param))

    app.add_exception_handler(EdgeError, on_edge_error)
    app.add_exception_handler(EngineError, on_engine_error)
    app.add_exception_handler(StarletteHTTPException, on_http_error)
    app.add_exception_handler(RequestValidationError, on_validation_error)
