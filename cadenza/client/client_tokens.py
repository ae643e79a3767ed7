"""The app server's side of the browser flow: mint a short-lived client token with the key it
holds, and hand the browser the token, never the key (docs/security.md)::

    from cadenza.client import mint_client_token

    token = mint_client_token("https://voice.example.com", api_key=KEY, ttl_s=300,
                              models=["orpheus"], origin="https://app.example.com")
    # send token.token to the page; it opens its stream with it (hello.api_key, Bearer)

A token is accepted wherever a key is: ``connect(url, api_key=token.token)`` and
``WebRTCPeer(url, api_key=token.token)`` take one as they take a key.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import httpx


@dataclass(frozen=True)
class ClientToken:
    """A minted token and when it expires (unix seconds)."""

    token: str
    expires_at: int


class TokenMintError(RuntimeError):
    """The server refused to mint (``code`` from docs/protocol.md; ``status`` its HTTP status)."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status = status
        self.code = code
        self.message = message


def mint_client_token(
    base_url: str,
    api_key: str,
    *,
    ttl_s: float | None = None,
    models: Sequence[str] | None = None,
    max_audio_s: float | None = None,
    origin: str | None = None,
    timeout_s: float = 10.0,
) -> ClientToken:
    """``POST {base_url}/v1/client_tokens`` with ``api_key``; the fields left ``None`` are not
    sent (the server's defaults apply). Raises :class:`TokenMintError` on a refusal and
    ``httpx.HTTPError`` when the server cannot be reached."""
    body: dict[str, Any] = {
        name: value
        for name, value in (
            ("ttl_s", ttl_s),
            ("models", None if models is None else list(models)),
            ("max_audio_s", max_audio_s),
            ("origin", origin),
        )
        if value is not None
    }
    response = httpx.post(
        f"{base_url.rstrip('/')}/v1/client_tokens",
        json=body,
        headers={"Authorization": f"Bearer {api_key}"},
        timeout=timeout_s,
    )
    if response.status_code != 200:
        try:
            error = response.json()["error"]
            code, message = str(error["code"]), str(error["message"])
        except (ValueError, KeyError, TypeError):
            code, message = "http_error", response.text[:200]
        raise TokenMintError(response.status_code, code, message)
    answer = response.json()
    return ClientToken(token=str(answer["token"]), expires_at=int(answer["expires_at"]))
