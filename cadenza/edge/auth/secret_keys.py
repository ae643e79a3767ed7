"""Keys derived from ``auth.token_secret``, one per purpose, so that no two uses share a key.

HKDF-SHA256 (RFC 5869) with the purpose as its ``info``: every node with the same secret
derives the same keys; a key for one purpose tells nothing of another's, or of the secret.
"""

from __future__ import annotations

from typing import Literal

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

Purpose = Literal["client-tokens", "checkpoints"]

_SALT = b"cadenza auth.token_secret v1"


def derived_key(secret: str, purpose: Purpose, length: int = 32) -> bytes:
    """The ``length``-byte key for ``purpose`` derived from ``secret``."""
    hkdf = HKDF(algorithm=hashes.SHA256(), length=length, salt=_SALT, info=purpose.encode())
    return hkdf.derive(secret.encode())
