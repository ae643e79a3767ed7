"""Microphone audio a client sends for a speech prompt, collected at the edge.

WebSocket clients announce the format with ``audio_in`` and then send binary messages (16-bit
PCM bytes, or one Opus packet each); WebRTC clients send a microphone track. Either way the
edge keeps the most recent ``max_seconds`` as float32 mono, and a ``speak`` with
``use_audio_prompt`` takes it, resampled to the codec's rate (the engine encodes it to codec
frames).
"""

from __future__ import annotations

import numpy as np

from cadenza.edge.media.opus import OpusError, OpusPacketDecoder
from cadenza.edge.media.resampler import ResampleError, resample
from cadenza.edge.media.wav import s16le_to_float
from cadenza.edge.streams.protocol import ProtocolError


class MicrophoneBuffer:
    def __init__(self, fmt: str, sample_rate: int, max_seconds: float) -> None:
        self.format = fmt
        self.sample_rate = 48000 if fmt == "opus" else sample_rate
        self.max_samples = int(max_seconds * self.sample_rate)
        self._opus = OpusPacketDecoder() if fmt == "opus" else None
        self._pieces: list[np.ndarray] = []
        self._samples = 0

    @property
    def seconds(self) -> float:
        return self._samples / self.sample_rate

    def append_bytes(self, data: bytes) -> None:
        """One binary message. Raises :class:`ProtocolError` (``invalid_audio``)."""
        try:
            samples = self._opus.decode(data) if self._opus is not None else s16le_to_float(data)
        except (OpusError, ValueError) as exc:
            raise ProtocolError("invalid_audio", str(exc)) from exc
        self.append_samples(samples)

    def append_samples(self, samples: np.ndarray) -> None:
        """Keep the newest ``max_seconds``: older audio falls off the front."""
        if not samples.size:
            return
        self._pieces.append(np.asarray(samples, dtype=np.float32))
        self._samples += samples.size
        while len(self._pieces) > 1 and self._samples - self._pieces[0].size >= self.max_samples:
            self._samples -= self._pieces.pop(0).size

    def take(self, sample_rate: int) -> bytes:
        """The collected audio at ``sample_rate`` (float32 little-endian) and an empty buffer.
        Raises :class:`ProtocolError`: ``no_prompt_audio`` when there is none,
        ``invalid_audio`` when its rate cannot be converted."""
        if not self._samples:
            raise ProtocolError("no_prompt_audio", "no microphone audio has been received")
        audio = np.concatenate(self._pieces)[-self.max_samples :]
        self._pieces, self._samples = [], 0
        try:
            resampled = resample(audio, self.sample_rate, sample_rate)
        except ResampleError as exc:
            raise ProtocolError("invalid_audio", str(exc)) from exc
        return resampled.astype("<f4").tobytes()
