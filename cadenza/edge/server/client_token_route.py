"""``POST /v1/client_tokens``: an app server (holding a key) mints a short-lived token for a
browser (:mod:`cadenza.edge.auth.client_tokens`).

Request (every field optional)::

    {"ttl_s": 300, "models": ["orpheus"], "max_audio_s": 60, "origin": "https://app.example.com"}

Answer 200 ``{"token": "...", "expires_at": <unix seconds>}`` (``Cache-Control: no-store``).
Refusals: 401 without a valid key; 403 ``forbidden`` for a client token (tokens do not mint
tokens); 400 ``invalid_value`` for ``ttl_s`` outside (0, ``auth.max_token_ttl_s``] or
``max_audio_s`` outside (0, ``limits.max_duration_s``], ``model_not_found`` for a model not
served here, ``origin_not_allowed`` for an origin outside ``auth.allowed_origins`` (where it is
set); 501 ``client_tokens_disabled`` without ``auth.token_secret``.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from cadenza.edge.auth.client_tokens import TokenScope
from cadenza.edge.auth.origins import normalized_origin
from cadenza.edge.server.state import EdgeState
from cadenza.edge.streams.errors import EdgeError
from cadenza.edge.transports.http_io import read_body
from cadenza.edge.transports.json_body import parse_json_body

router = APIRouter()

MAX_BODY_BYTES = 16 * 1024
DEFAULT_TTL_S = 300.0


class TokenRequest(BaseModel):
    """The body of ``POST /v1/client_tokens``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    ttl_s: float = Field(DEFAULT_TTL_S, gt=0, strict=False)
    models: list[str] | None = Field(None, min_length=1, max_length=64)
    max_audio_s: float | None = Field(None, gt=0)
    origin: str | None = Field(None, max_length=512)


@router.post("/v1/client_tokens")
async def mint_client_token(request: Request) -> JSONResponse:
    state: EdgeState = request.app.state.edge
    minter = state.authenticate(
        request.headers.get("authorization"),
        request.client.host if request.client else None,
        request.headers.get("origin"),
    )
    if not minter.may_mint:
        raise EdgeError(403, "a client token cannot mint client tokens", code="forbidden")
    tokens = state.auth.tokens
    if tokens is None:
        raise EdgeError(
            501,
            "client tokens need auth.token_secret (CADENZA_AUTH__TOKEN_SECRET)",
            code="client_tokens_disabled",
        )
    raw = await read_body(
        request, max_bytes=MAX_BODY_BYTES, timeout_s=state.config.server.request_body_timeout_s
    )
    body = parse_json_body(raw, TokenRequest, empty_is_object=True)
    scope = _scope(state, body)
    token, expires_at = tokens.mint(minter, body.ttl_s, scope)
    return JSONResponse(
        {"token": token, "expires_at": expires_at}, headers={"Cache-Control": "no-store"}
    )


def _scope(state: EdgeState, body: TokenRequest) -> TokenScope:
    """What ``body`` asks the token to be limited to, checked against this server."""
    auth, limits = state.config.auth, state.config.limits
    if body.ttl_s > auth.max_token_ttl_s:
        raise EdgeError(
            400,
            f"ttl_s: at most {auth.max_token_ttl_s:g} s (auth.max_token_ttl_s)",
            code="invalid_value",
            param="ttl_s",
        )
    if body.max_audio_s is not None and body.max_audio_s > limits.max_duration_s:
        raise EdgeError(
            400,
            f"max_audio_s: at most {limits.max_duration_s:g} s (limits.max_duration_s)",
            code="invalid_value",
            param="max_audio_s",
        )
    models = None
    if body.models is not None:
        models = tuple(dict.fromkeys(body.models))
        for model in models:
            state.service(model)  # 400 model_not_found
    origin = None
    if body.origin is not None:
        origin = normalized_origin(body.origin)
        if origin is None:
            raise EdgeError(
                400,
                "origin: not a web origin (scheme://host[:port])",
                code="invalid_value",
                param="origin",
            )
        if auth.allowed_origins and origin not in auth.allowed_origins:
            raise EdgeError(
                400,
                f"origin: {origin} is not one of auth.allowed_origins",
                code="origin_not_allowed",
                param="origin",
            )
    return TokenScope(models=models, max_audio_s=body.max_audio_s, origin=origin)
