"""Sealing what a stream checkpoint holds of its user (:mod:`cadenza.edge.streams.checkpoints`):
AES-256-GCM, so that Redis, its backups and whoever reads them see neither the text nor the
voice, context, prompt audio, sampling or tokens of a stream.

The key ``auth.token_secret`` derives for checkpoints
(:func:`~cadenza.edge.auth.secret_keys.derived_key`) is expanded (HKDF-Expand, SHA-256) into
one key per stream token: every node of a fleet that shares the secret opens what any of them
sealed, a node with another secret opens nothing, and no one key seals more than one stream's
items (a few hundred), far below the 2^32 messages at which GCM's random nonces start to risk
colliding.

Each item is sealed on its own, with a random 96-bit nonce, as ``version || nonce ||
ciphertext-and-tag``. Its associated data names the stream token and the item's field (the
head with the owner it was written for, or ``rows/<index>``), so an item moved to another
stream, to another field or to another place in a stream's rows no longer opens.
"""

from __future__ import annotations

import os

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDFExpand

from cadenza.edge.auth.secret_keys import derived_key

VERSION = b"\x01"
NONCE_BYTES = 12
TAG_BYTES = 16
_CONTEXT = b"cadenza stream checkpoint v1"


class SealBroken(Exception):
    """A sealed item that does not open: altered, moved, or sealed under another secret."""


class CheckpointSeal:
    """The checkpoints' key (32 bytes), from which each stream's is expanded."""

    def __init__(self, key: bytes) -> None:
        if len(key) != 32:
            raise ValueError("a checkpoint seal needs a 32-byte key")
        self._key = key

    @classmethod
    def from_secret(cls, secret: str) -> CheckpointSeal:
        """The seal every node with ``secret`` (``auth.token_secret``) shares."""
        return cls(derived_key(secret, "checkpoints"))

    def stream(self, token: str) -> StreamSeal:
        """What seals and opens the items of the stream ``token``."""
        info = _CONTEXT + b"\0" + token.encode()
        key = HKDFExpand(algorithm=hashes.SHA256(), length=32, info=info).derive(self._key)
        return StreamSeal(AESGCM(key), token)


class StreamSeal:
    """Seals and opens the checkpoint items of one stream."""

    def __init__(self, aead: AESGCM, token: str) -> None:
        self._aead = aead
        self.token = token

    def seal(self, plaintext: bytes, field: str) -> bytes:
        """``plaintext`` sealed as the stream's ``field``."""
        nonce = os.urandom(NONCE_BYTES)
        return VERSION + nonce + self._aead.encrypt(nonce, plaintext, self._associated(field))

    def open(self, sealed: bytes, field: str) -> bytes:
        """What :meth:`seal` sealed as the stream's ``field``. Raises :class:`SealBroken`."""
        if len(sealed) < len(VERSION) + NONCE_BYTES + TAG_BYTES or not sealed.startswith(VERSION):
            raise SealBroken(f"{field}: not a sealed checkpoint item")
        nonce = sealed[len(VERSION) : len(VERSION) + NONCE_BYTES]
        body = sealed[len(VERSION) + NONCE_BYTES :]
        try:
            return self._aead.decrypt(nonce, body, self._associated(field))
        except InvalidTag:
            raise SealBroken(
                f"{field}: does not open (altered, moved, or another secret)"
            ) from None

    def _associated(self, field: str) -> bytes:
        # Tokens are URL-safe base64 and fields printable: NUL separates them unambiguously.
        return b"\0".join((_CONTEXT, self.token.encode(), field.encode()))
