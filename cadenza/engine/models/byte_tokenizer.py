"""Byte-level text tokenizer: UTF-8 bytes are the tokens, so every string has an encoding."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ByteTokenizer:
    """Token ``b`` is byte value ``b`` (0-255); ``bos_id`` (256) opens every prompt."""

    vocab_size: int = 257
    bos_id: int = 256

    def encode(self, text: str) -> list[int]:
        return [self.bos_id, *text.encode("utf-8")]

    def decode(self, ids: list[int]) -> str:
        return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")
