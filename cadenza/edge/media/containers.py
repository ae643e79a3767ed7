"""Incremental encoders from float32 PCM chunks to the bytes of a response format.

``open_encoder(fmt, sample_rate)`` returns an encoder whose ``encode(chunk)`` gives the bytes to
send for each chunk as it arrives and whose ``finish()`` gives the trailing bytes. The formats
are the OpenAI speech API's: ``wav`` (16-bit, streaming header) and ``pcm`` (16-bit signed
little-endian, no header) are written directly; ``mp3``, ``opus`` (Ogg Opus), ``aac`` (ADTS)
and ``flac`` are muxed by PyAV into memory and handed out as they are produced.
"""

from __future__ import annotations

import fractions
from typing import Protocol

import av
import numpy as np

from cadenza.edge.media.wav import float_to_s16le, streaming_wav_header

#: Response formats the OpenAI speech API defines; all are supported.
OPENAI_FORMATS = ("mp3", "opus", "aac", "flac", "wav", "pcm")

MEDIA_TYPES = {
    "mp3": "audio/mpeg",
    "opus": "audio/ogg",
    "aac": "audio/aac",
    "flac": "audio/flac",
    "wav": "audio/wav",
    "pcm": "audio/pcm",
}

# format name -> (PyAV container format, encoder, options)
_MUXED: dict[str, tuple[str, str, dict[str, str]]] = {
    "mp3": ("mp3", "libmp3lame", {}),
    "opus": ("ogg", "libopus", {}),
    "aac": ("adts", "aac", {}),
    "flac": ("flac", "flac", {}),
}


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


class _ByteSink:
    """A write-only file for PyAV's muxer; :meth:`take` hands over what was written."""

    def __init__(self) -> None:
        self._pieces: list[bytes] = []

    def write(self, data: bytes) -> int:
        self._pieces.append(bytes(data))
        return len(data)

    def take(self) -> bytes:
        data, self._pieces = b"".join(self._pieces), []
        return data


class MuxedEncoder:
    """A PyAV encoder + muxer writing into memory; frames are cut to the codec's frame size."""

    def __init__(self, fmt: str, sample_rate: int) -> None:
        container_format, codec, options = _MUXED[fmt]
        self.media_type = MEDIA_TYPES[fmt]
        self.sample_rate = sample_rate
        self._sink = _ByteSink()
        self._container = av.open(self._sink, mode="w", format=container_format)
        stream = self._container.add_stream(codec, rate=sample_rate, layout="mono", options=options)
        assert isinstance(stream, av.AudioStream)
        self._stream = stream
        context = self._stream.codec_context
        context.open()
        self._frame_size = context.frame_size or 1024
        self._convert = av.AudioResampler(
            format=context.format.name, layout="mono", rate=sample_rate
        )
        self._fifo = av.AudioFifo()
        self._pts = 0
        self._finished = False

    def encode(self, audio: np.ndarray) -> bytes:
        samples = np.ascontiguousarray(audio, dtype=np.float32).clip(-1.0, 1.0)
        if samples.size:
            frame = av.AudioFrame.from_ndarray(samples[None], format="flt", layout="mono")
            frame.sample_rate = self.sample_rate
            frame.pts = self._pts
            frame.time_base = fractions.Fraction(1, self.sample_rate)
            self._pts += samples.size
            for converted in self._convert.resample(frame):
                self._fifo.write(converted)
        while self._fifo.samples >= self._frame_size:
            self._mux(self._fifo.read(self._frame_size))
        return self._sink.take()

    def finish(self) -> bytes:
        if self._finished:
            return b""
        self._finished = True
        rest = self._fifo.read()
        if rest is not None:
            self._mux(rest)
        self._mux(None)
        self._container.close()
        return self._sink.take()

    def _mux(self, frame: av.AudioFrame | None) -> None:
        for packet in self._stream.encode(frame):
            self._container.mux(packet)


def open_encoder(fmt: str, sample_rate: int) -> StreamEncoder:
    if fmt == "wav":
        return WavEncoder(sample_rate)
    if fmt == "pcm":
        return PcmEncoder()
    if fmt in _MUXED:
        return MuxedEncoder(fmt, sample_rate)
    raise UnsupportedFormat(
        f"response_format {fmt!r} is not supported; supported: {', '.join(OPENAI_FORMATS)}"
    )
