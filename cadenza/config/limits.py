"""``[limits]``: what any one request may ask for, whatever the transport; and the fleet's
Redis (``redis_url``), whose password, if the URL carries one, is shown only as ``***``
(:func:`redacted_url`) wherever the URL is logged or named in an error."""

from __future__ import annotations

from typing import Literal
from urllib.parse import urlsplit

from pydantic import Field, field_validator

from cadenza.config.section import Section


class LimitsConfig(Section):
    """Validation limits applied to every request, whatever the transport."""

    max_input_chars: int = Field(4096, ge=1, description="longest text accepted")
    max_duration_s: float = Field(300.0, gt=0, description="longest audio one request may ask for")
    chars_per_second: float = Field(
        14.0, gt=0, description="speaking rate used to derive a request's duration from its text"
    )
    min_duration_s: float = Field(1.0, gt=0, description="shortest derived duration")
    requests_per_minute: float = Field(
        0, ge=0, description="requests one client (API key, or IP when open) may start; 0: any"
    )
    audio_seconds_per_minute: float = Field(
        0, ge=0, description="seconds of audio one client may request per minute; 0: any"
    )
    max_streams_per_client: int = Field(
        0,
        ge=0,
        description="streams one credential (an API key, a client token, an address on an open "
        "server) may have open at once, queued ones included; more get 429 too_many_streams "
        "(with redis_url, counted across the fleet); 0: any",
    )
    redis_url: str | None = Field(
        None,
        description="share the request and audio-second buckets and the open streams per "
        "client across the fleet in this Redis (redis://HOST:PORT/DB, rediss:// with TLS, "
        "unix:///PATH); unset: this node's own",
    )
    redis_failure: Literal["open", "closed"] = Field(
        "open",
        description="while Redis cannot be reached: 'open' admits by this node's own buckets "
        "and stream counts, 'closed' refuses new streams with 503 quota_unavailable (sharing "
        "resumes by itself)",
    )
    max_prompt_audio_s: float = Field(
        20.0, gt=0, description="longest speech prompt (microphone audio) a request may carry"
    )
    max_context_s: float = Field(
        120.0,
        gt=0,
        description="conversation sessions keep their most recent turns up to this many "
        "seconds of audio as the next turn's context (older turns are dropped)",
    )

    @field_validator("redis_url")
    @classmethod
    def _redis_url(cls, url: str | None) -> str | None:
        if url is None:
            return None
        parts = urlsplit(url)
        shown = repr(redacted_url(url))
        if parts.scheme not in ("redis", "rediss", "unix"):
            raise ValueError(f"{shown} is not a Redis URL (redis://HOST:PORT/DB)")
        if parts.scheme != "unix" and not parts.hostname:
            raise ValueError(f"{shown} names no host (redis://HOST:PORT/DB)")
        try:
            parts.port  # noqa: B018 (raises on a port that is not a number or out of range)
        except ValueError as exc:
            raise ValueError(f"{shown} has a bad port: {exc}") from None
        database = parts.path.strip("/")
        if parts.scheme != "unix" and database and not database.isdigit():
            raise ValueError(f"{shown}: the database must be a number (redis://HOST:PORT/DB)")
        return url


def redacted_url(url: str) -> str:
    """``url`` as logs and error messages may show it: a password in its user part
    (``redis://:pw@host``, ``redis://user:pw@host``) or its query (``?password=pw``) becomes
    ``***``, and so does a user part without a colon (``redis://pw@host``: some clients take it
    for the password). The rest (scheme, host, port, database) stays, to say which server."""
    parts = urlsplit(url)
    redacted = url
    if "@" in parts.netloc:  # the netloc comes first after the scheme: replaced there
        user, _, host = parts.netloc.rpartition("@")
        name, colon, _ = user.partition(":")
        redacted = redacted.replace(
            parts.netloc, f"{name}:***@{host}" if colon else f"***@{host}", 1
        )
    if parts.query:
        query = "&".join(
            f"{piece.partition('=')[0]}=***"
            if piece.partition("=")[0].lower() in _PASSWORD_PARAMETERS
            else piece
            for piece in parts.query.split("&")
        )
        redacted = redacted.replace(f"?{parts.query}", f"?{query}", 1)
    return redacted


_PASSWORD_PARAMETERS = ("password", "pass", "pwd")
