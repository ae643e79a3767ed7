"""Resume tokens: the name a resumable stream is given in ``started``, which its client sends
back in ``resume`` to go on with it on any node (:mod:`cadenza.edge.streams.checkpoints`)."""

from __future__ import annotations

import secrets

TOKEN_PATTERN = r"^[A-Za-z0-9_-]{16,64}$"


def new_token() -> str:
    """An unguessable token: 32 URL-safe characters, 192 random bits."""
    return secrets.token_urlsafe(24)
