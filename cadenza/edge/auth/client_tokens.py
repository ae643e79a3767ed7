"""Client tokens: short-lived, scoped credentials an app server mints for a browser.

A browser must never hold a stream key: the app server (which does) asks
``POST /v1/client_tokens`` for a token and hands the browser that instead. A token is a JWT
(HS256, PyJWT) signed with a key derived from ``auth.token_secret``
(:mod:`~cadenza.edge.auth.secret_keys`), so it is stateless: any node with the same secret
accepts it, and nothing is stored. Its claims::

    iss "cadenza"   aud "cadenza:stream"   sub  the minting client (key:<id>)
    jti  a random id (the token's own name)  iat, exp  unix seconds
    models       the models it may open (absent: any)
    max_audio_s  the longest one of its streams may play (absent: the server's limit)
    origin       the only web origin it is accepted from (absent: any the server allows)

Accepted wherever a key is (HTTP ``Authorization: Bearer``, WebSocket ``hello.api_key``,
WebRTC offers), it charges its minter's rate limits and quotas, and can neither mint tokens
nor reach ``/admin/*``. Verification refuses an expired token with ``token_expired`` and any
other bad token (forged, altered, malformed, another audience, an unknown algorithm) with
``invalid_token``, both 401.
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass
from typing import Any

import jwt

from cadenza.edge.auth.principal import TOKEN_LEEWAY_S, Principal
from cadenza.edge.auth.secret_keys import derived_key

ISSUER = "cadenza"
AUDIENCE = "cadenza:stream"
ALGORITHM = "HS256"
MAX_TOKEN_CHARS = 4096


class TokenRefused(Exception):
    """A presented token that is not accepted; ``code`` is ``token_expired`` or
    ``invalid_token``."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass(frozen=True)
class TokenScope:
    """What a minted token may do (``None``: no restriction beyond the server's)."""

    models: tuple[str, ...] | None = None
    max_audio_s: float | None = None
    origin: str | None = None


class ClientTokens:
    """Mints and verifies client tokens with the key derived from ``secret``."""

    def __init__(self, secret: str) -> None:
        self._key = derived_key(secret, "client-tokens")

    def mint(
        self, minter: Principal, ttl_s: float, scope: TokenScope, now: float | None = None
    ) -> tuple[str, int]:
        """A token for ``minter`` (a key's principal) living ``ttl_s`` seconds, and its expiry
        (unix seconds)."""
        issued = int(time.time() if now is None else now)
        expires = issued + max(1, round(ttl_s))
        claims: dict[str, Any] = {
            "iss": ISSUER,
            "aud": AUDIENCE,
            "sub": minter.client,
            "jti": secrets.token_urlsafe(12),
            "iat": issued,
            "exp": expires,
        }
        if scope.models is not None:
            claims["models"] = list(scope.models)
        if scope.max_audio_s is not None:
            claims["max_audio_s"] = scope.max_audio_s
        if scope.origin is not None:
            claims["origin"] = scope.origin
        return jwt.encode(claims, self._key, algorithm=ALGORITHM), expires

    def verify(self, token: str) -> Principal:
        """The principal ``token`` grants. Raises :class:`TokenRefused`."""
        if len(token) > MAX_TOKEN_CHARS:
            raise TokenRefused("invalid_token", "client token too long")
        try:
            claims = jwt.decode(
                token,
                self._key,
                algorithms=[ALGORITHM],
                audience=AUDIENCE,
                issuer=ISSUER,
                leeway=TOKEN_LEEWAY_S,
                options={"require": ["exp", "iat", "sub", "jti", "iss", "aud"]},
            )
        except jwt.ExpiredSignatureError:
            raise TokenRefused("token_expired", "the client token has expired") from None
        except jwt.PyJWTError as exc:
            raise TokenRefused("invalid_token", f"invalid client token: {exc}") from None
        return _principal(claims)


def looks_like_token(credential: str) -> bool:
    """Whether ``credential`` has a JWT's shape (three base64url parts), as a key need not."""
    parts = credential.split(".")
    return len(parts) == 3 and all(parts[:2]) and credential.startswith("eyJ")


def _principal(claims: dict[str, Any]) -> Principal:
    subject, token_id = claims["sub"], claims["jti"]
    models = claims.get("models")
    max_audio_s = claims.get("max_audio_s")
    origin = claims.get("origin")
    if (
        not isinstance(subject, str)
        or not isinstance(token_id, str)
        or not isinstance(claims["exp"], int | float)
        or (
            models is not None
            and (not isinstance(models, list) or not all(isinstance(m, str) for m in models))
        )
        or (max_audio_s is not None and not isinstance(max_audio_s, int | float))
        or (origin is not None and not isinstance(origin, str))
    ):
        raise TokenRefused("invalid_token", "invalid client token: malformed claims")
    return Principal(
        kind="client_token",
        client=subject,
        holder=f"token:{token_id}",
        models=None if models is None else frozenset(models),
        max_audio_s=None if max_audio_s is None else float(max_audio_s),
        origin=origin,
        expires_at=float(claims["exp"]),
    )
