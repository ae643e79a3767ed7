"""Sealed checkpoint items: they open with the same secret, token and field they were sealed
for, and with nothing else; altered, truncated or moved items do not open; the sealed bytes
show nothing of what they hold."""

from __future__ import annotations

import pytest

from cadenza.edge.streams.checkpoint_seal import CheckpointSeal, SealBroken

SECRET = "a fleet's token secret, 32 characters or more"
TOKEN = "T" * 32
TEXT = b"a sentence only its listener should read"


def test_an_item_opens_where_it_was_sealed_and_shows_nothing() -> None:
    seal = CheckpointSeal.from_secret(SECRET).stream(TOKEN)
    sealed = seal.seal(TEXT, "rows/0")
    assert TEXT not in sealed and b"sentence" not in sealed
    assert CheckpointSeal.from_secret(SECRET).stream(TOKEN).open(sealed, "rows/0") == TEXT
    assert seal.seal(TEXT, "rows/0") != sealed  # a nonce of its own every time


@pytest.mark.parametrize(
    ("secret", "token", "field"),
    [
        (SECRET, TOKEN, "rows/1"),  # another place in the same stream
        (SECRET, TOKEN, "head/key:alice"),  # another field
        (SECRET, "U" * 32, "rows/0"),  # another stream
        ("another fleet's secret, also 32 characters", TOKEN, "rows/0"),
    ],
    ids=["other-index", "other-field", "other-stream", "other-secret"],
)
def test_an_item_moved_or_opened_with_another_secret_does_not_open(secret, token, field) -> None:
    sealed = CheckpointSeal.from_secret(SECRET).stream(TOKEN).seal(TEXT, "rows/0")
    with pytest.raises(SealBroken):
        CheckpointSeal.from_secret(secret).stream(token).open(sealed, field)


@pytest.mark.parametrize("damage", ["flip-nonce", "flip-body", "flip-tag", "truncate", "version"])
def test_an_altered_item_does_not_open(damage: str) -> None:
    seal = CheckpointSeal.from_secret(SECRET).stream(TOKEN)
    sealed = bytearray(seal.seal(TEXT, "rows/0"))
    at = {"flip-nonce": 3, "flip-body": 20, "flip-tag": -1, "version": 0}.get(damage)
    if at is not None:
        sealed[at] ^= 0x01
    else:
        sealed = sealed[:20]
    with pytest.raises(SealBroken):
        seal.open(bytes(sealed), "rows/0")


def test_a_seal_needs_an_aes_256_key() -> None:
    with pytest.raises(ValueError):
        CheckpointSeal(b"short")
