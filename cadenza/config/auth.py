"""``[auth]``: who may use the server and from where (docs/security.md).

Stream keys (``api_keys_file``) open streams and mint client tokens; admin keys
(``admin_keys_file``) reach ``/admin/*`` too; client tokens, signed with ``token_secret``, are
what a browser holds. ``allowed_origins`` and ``trusted_hosts`` say which web pages and which
``Host`` names the server answers.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from pydantic import Field, SecretStr, field_validator

from cadenza.config.section import Section

MIN_TOKEN_SECRET_CHARS = 32


class AuthConfig(Section):
    """API keys, admin keys, client tokens, browser origins and trusted hosts."""

    api_keys_file: str | None = Field(
        None,
        description="file of stream keys (one per line, or sha256:<hex>); unset: the server is "
        "open (every client may stream; /admin/* only from the loopback interface)",
    )
    admin_keys_file: str | None = Field(
        None,
        description="file of admin keys (same format): with it, /admin/* takes only these keys "
        "(403 for stream keys and client tokens); an admin key streams and mints tokens too. "
        "Unset: /admin/* answers only a loopback socket peer",
    )
    token_secret: SecretStr | None = Field(
        None,
        description="the secret client tokens are signed with (HS256) and stream checkpoints "
        f"sealed with; at least {MIN_TOKEN_SECRET_CHARS} characters, the same on every node of "
        "a fleet (CADENZA_AUTH__TOKEN_SECRET). Unset: POST /v1/client_tokens answers 501 and "
        "the server keeps no checkpoints (streams do not survive their node)",
    )
    max_token_ttl_s: float = Field(
        3600.0, gt=0, le=86400, description="longest lifetime a client token may ask for"
    )
    allowed_origins: list[str] = Field(
        default_factory=list,
        max_length=256,
        description="web origins (scheme://host[:port]) whose pages may use the server besides "
        "its own (same-origin pages always may): any request or WebSocket upgrade from another "
        "origin gets 403, and listed ones get CORS answers. Clients that send no Origin "
        "(programs) are not affected",
    )
    trusted_hosts: list[str] = Field(
        default_factory=list,
        max_length=256,
        description="Host header values the server answers (a name, *.suffix, or name:port); "
        "other hosts get 400 (DNS rebinding). Empty: any host",
    )

    @field_validator("token_secret")
    @classmethod
    def _long_enough(cls, secret: SecretStr | None) -> SecretStr | None:
        if secret is not None and len(secret.get_secret_value()) < MIN_TOKEN_SECRET_CHARS:
            raise ValueError(
                f"the token secret needs at least {MIN_TOKEN_SECRET_CHARS} characters "
                "(python -c 'import secrets; print(secrets.token_urlsafe(48))')"
            )
        return secret

    @field_validator("allowed_origins")
    @classmethod
    def _origins(cls, origins: list[str]) -> list[str]:
        normalized = []
        for origin in origins:
            parts = urlsplit(origin.strip())
            if (
                parts.scheme not in ("http", "https")
                or not parts.hostname
                or parts.path not in ("", "/")
                or parts.query
                or parts.fragment
                or parts.username
            ):
                raise ValueError(
                    f"{origin!r} is not a web origin (scheme://host[:port], such as "
                    "https://app.example.com)"
                )
            try:
                port = parts.port
            except ValueError as exc:
                raise ValueError(f"{origin!r} has a bad port: {exc}") from None
            normalized.append(web_origin(parts.scheme, parts.hostname, port))
        return normalized

    @field_validator("trusted_hosts")
    @classmethod
    def _hosts(cls, hosts: list[str]) -> list[str]:
        for host in hosts:
            name = host.removeprefix("*.")
            if not name or any(c in name for c in "/ @?#*") or name != name.strip():
                raise ValueError(f"{host!r} is not a host name (name, *.suffix or name:port)")
        return [host.lower() for host in hosts]


def web_origin(scheme: str, host: str, port: int | None) -> str:
    """An origin as browsers serialise it: lower case, the default port left out."""
    default = {"http": 80, "https": 443}[scheme]
    host = host.lower()
    if ":" in host:  # an IPv6 literal
        host = f"[{host}]"
    return f"{scheme}://{host}" if port in (None, default) else f"{scheme}://{host}:{port}"
