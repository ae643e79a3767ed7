"""Incremental encoders from float32 PCM chunks to the bytes of a response format.

``open_encoder(fmt, sample_rate)`` returns an encoder whose ``encode(chunk)`` gives the bytes to
send for each chunk as it arrives and whose ``finish()`` gives the trailing bytes. Formats today:
``wav`` (16-bit, streaming header) and ``pcm`` (16-bit signed little-endian, no header).
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from cadenza.codecs.wav import float_to_s16le, streaming_wav_header

#: Response formats the OpenAI speech API defines, and the ones this build can produce.
OPENAI_FORMATS = ("mp3", "opus", "aac", "flac", "wav", "pcm")
SUPPORTED_FORMATS = ("wav", "pcm")

MEDIA_TYPES = {"wav": "audio/wav", "pcm": "audio/pcm"}


class UnsupportedFormat(ValueError):
    pass


class StreamEncoder(Protocol):
    media_type: str

    def encode(self, audio: np.ndarray) -> bytes: ...

    def finish(self) -> bytes: ...


class PcmEncoder:
    media_type = MEDIA_TYPES["pcm"]

    def encode(self, audio: np.ndarray) -> bytes:
        return float_to_s16le(audio)

    def finish(self) -> bytes:
        return b""


class WavEncoder(PcmEncoder):
    """PCM with a streaming WAV header in front of the first chunk."""

    media_type = MEDIA_TYPES["wav"]

    def __init__(self, sample_rate: int) -> None:
        self._header: bytes | None = streaming_wav_header(sample_rate)

    def encode(self, audio: np.ndarray) -> bytes:
        header, self._header = self._header or b"", None
        return header + super().encode(audio)

    def finish(self) -> bytes:
        header, self._header = self._header or b"", None
        return header


def open_encoder(fmt: str, sample_rate: int) -> StreamEncoder:
    if fmt == "wav":
        return WavEncoder(sample_rate)
    if fmt == "pcm":
        return PcmEncoder()
    raise UnsupportedFormat(
        f"response_format {fmt!r} is not supported yet; supported: {', '.join(SUPPORTED_FORMATS)}"
    )
