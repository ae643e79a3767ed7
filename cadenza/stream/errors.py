"""API errors in OpenAI's shape: ``{"error": {"message", "type", "param", "code"}}``."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from cadenza.admission.gate import AdmissionRefused
from cadenza.admission.validation import InvalidRequest


class ApiError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        *,
        code: str,
        param: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.param = param
        self.headers = headers

    @classmethod
    def from_invalid(cls, exc: InvalidRequest) -> ApiError:
        return cls(exc.status, exc.message, code=exc.code, param=exc.param)

    @classmethod
    def from_refusal(cls, exc: AdmissionRefused) -> ApiError:
        """Over capacity: 503 with ``Retry-After``; a request that can never fit: 400."""
        if exc.code == "too_large":
            return cls(400, str(exc), code=exc.code, param="max_duration_s")
        return cls(503, str(exc), code=exc.code, headers={"Retry-After": exc.retry_after_header})


def error_type(status: int) -> str:
    if status == 401:
        return "authentication_error"
    if status == 429:
        return "rate_limit_error"
    if status >= 500:
        return "server_error"
    return "invalid_request_error"


def error_response(
    status: int,
    message: str,
    *,
    code: str,
    param: str | None = None,
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    body = {"error": {"message": message, "type": error_type(status), "param": param, "code": code}}
    return JSONResponse(body, status_code=status, headers=headers)


def install_error_handlers(app: FastAPI) -> None:
    """Every error the app returns, including FastAPI's own, takes the OpenAI shape."""

    async def on_api_error(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, ApiError)
        return error_response(
            exc.status, exc.message, code=exc.code, param=exc.param, headers=exc.headers
        )

    async def on_http_error(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        return error_response(exc.status_code, str(exc.detail), code=code)

    async def on_validation_error(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        first = exc.errors()[0]
        param = ".".join(str(p) for p in first["loc"] if p != "body") or None
        return error_response(400, f"{param}: {first['msg']}", code="invalid_value", param=param)

    app.add_exception_handler(ApiError, on_api_error)
    app.add_exception_handler(StarletteHTTPException, on_http_error)
    app.add_exception_handler(RequestValidationError, on_validation_error)
