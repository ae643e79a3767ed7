"""API keys: which bearer tokens may use the server.

The key file holds one key per line: the key itself, or ``sha256:<64 hex digits>`` so the file
need not contain secrets. Blank lines and ``#`` comments are ignored. Presented keys are hashed
and compared with every entry in constant time (``hmac.compare_digest``), so the comparison
leaks neither which entry nor how much of a key matched.
"""

from __future__ import annotations

import hashlib
import hmac
from pathlib import Path


class ApiKeyFileError(ValueError):
    pass


class ApiKeys:
    def __init__(self, digests: list[bytes]) -> None:
        if not digests:
            raise ApiKeyFileError("the API key file holds no key")
        self._digests = digests

    @classmethod
    def load(cls, path: str | Path) -> ApiKeys:
        """Read a key file. Raises :class:`ApiKeyFileError` naming the bad line."""
        try:
            lines = Path(path).read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as exc:
            raise ApiKeyFileError(f"cannot read API key file {path}: {exc}") from exc
        digests = []
        for number, line in enumerate(lines, start=1):
            entry = line.strip()
            if not entry or entry.startswith("#"):
                continue
            if entry.startswith("sha256:"):
                try:
                    digest = bytes.fromhex(entry.removeprefix("sha256:"))
                except ValueError:
                    digest = b""
                if len(digest) != 32:
                    raise ApiKeyFileError(f"{path}:{number}: sha256: needs 64 hex digits")
            else:
                digest = hashlib.sha256(entry.encode()).digest()
            digests.append(digest)
        return cls(digests)

    def ids(self) -> frozenset[str]:
        """The id of every key in the file (as :meth:`check` names them)."""
        return frozenset(digest.hex()[:12] for digest in self._digests)

    def check(self, presented: str | None) -> str | None:
        """The key's id (the first 12 hex digits of its SHA-256) if it is valid, else None."""
        if not presented:
            return None
        digest = hashlib.sha256(presented.encode()).digest()
        matched = False
        for entry in self._digests:  # no early exit: every entry is compared
            matched |= hmac.compare_digest(digest, entry)
        return digest.hex()[:12] if matched else None


def bearer_token(authorization: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header value."""
    if not authorization:
        return None
    scheme, _, token = authorization.partition(" ")
    if scheme.lower() != "bearer":
        return None
    return token.strip() or None
