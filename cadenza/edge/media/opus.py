"""Raw Opus packets for real-time transports (WebSocket, WebRTC): 20 ms at 48 kHz.

:class:`OpusPacketEncoder` takes float32 chunks at any supported rate, resamples them to
48 kHz with carried state, and returns one Opus packet per complete 20 ms.
:class:`OpusPacketDecoder` turns received packets back into float32 48 kHz audio, refusing
corrupt packets with
:class:`OpusError` without losing its state for the packets that follow.
"""

from __future__ import annotations

import fractions

import av
import numpy as np

from cadenza.edge.media.resampler import StreamResampler

OPUS_RATE = 48000
FRAME_SAMPLES = 960  # 20 ms at 48 kHz


class OpusError(ValueError):
    pass


class OpusPacketEncoder:
    def __init__(self, input_rate: int, bitrate: int = 32000) -> None:
        self._resampler = StreamResampler(input_rate, OPUS_RATE)
        self._context = av.CodecContext.create("libopus", "w")
        self._context.sample_rate = OPUS_RATE
        self._context.layout = "mono"
        self._context.format = "flt"
        self._context.bit_rate = bitrate
        self._context.time_base = fractions.Fraction(1, OPUS_RATE)
        self._context.open()
        self._pending = np.zeros(0, np.float32)
        self._pts = 0

    def encode(self, audio: np.ndarray) -> list[bytes]:
        """Packets for every complete 20 ms of audio so far."""
        resampled = self._resampler.process(audio)
        self._pending = np.concatenate([self._pending, resampled])
        packets = []
        while self._pending.size >= FRAME_SAMPLES:
            frame_samples, self._pending = (
                self._pending[:FRAME_SAMPLES],
                self._pending[FRAME_SAMPLES:],
            )
            packets.extend(self._encode_frame(frame_samples))
        return packets

    def finish(self) -> list[bytes]:
        """The last packets: the resampler's tail, zero-padded to a whole frame."""
        tail = np.concatenate([self._pending, self._resampler.flush()])
        self._pending = np.zeros(0, np.float32)
        packets = []
        for start in range(0, tail.size, FRAME_SAMPLES):
            frame_samples = tail[start : start + FRAME_SAMPLES]
            padded = np.pad(frame_samples, (0, FRAME_SAMPLES - frame_samples.size))
            packets.extend(self._encode_frame(padded))
        return packets

    def _encode_frame(self, samples: np.ndarray) -> list[bytes]:
        frame = av.AudioFrame.from_ndarray(
            np.clip(samples, -1, 1).astype(np.float32)[None], format="flt", layout="mono"
        )
        frame.sample_rate = OPUS_RATE
        frame.pts = self._pts
        frame.time_base = fractions.Fraction(1, OPUS_RATE)
        self._pts += samples.size
        return [bytes(packet) for packet in self._context.encode(frame)]


class OpusPacketDecoder:
    def __init__(self) -> None:
        self._context = av.CodecContext.create("opus", "r")
        self._context.sample_rate = OPUS_RATE
        self._context.layout = "mono"
        self._context.open()

    def decode(self, packet: bytes) -> np.ndarray:
        """One Opus packet -> float32 mono 48 kHz samples. Raises :class:`OpusError`."""
        if not packet:
            raise OpusError("empty Opus packet")
        try:
            frames = self._context.decode(av.Packet(packet))
        except av.error.FFmpegError as exc:
            raise OpusError(f"corrupt Opus packet: {exc}") from exc
        if not frames:
            return np.zeros(0, np.float32)
        pieces = []
        for frame in frames:
            data = frame.to_ndarray()
            if frame.format.is_planar:
                data = data[:1]
            elif frame.layout.nb_channels > 1:
                data = data.reshape(-1, frame.layout.nb_channels)[:, 0]
            pieces.append(data.reshape(-1))
        audio = np.concatenate(pieces)
        if audio.dtype == np.int16:
            return audio.astype(np.float32) / 32768.0
        return audio.astype(np.float32)
