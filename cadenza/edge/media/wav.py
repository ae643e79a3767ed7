"""PCM and WAV for streaming responses, and WAV files read (numpy and the standard library
only, so the edge can use it).

A streamed WAV cannot know its length up front, so :func:`streaming_wav_header` declares the
largest sizes a RIFF file can hold (``0xFFFFFFFF`` minus the header); players and decoders
(ffmpeg, PyAV, browsers) read such files to the end of the data.
"""

from __future__ import annotations

import io
import struct
import wave

import numpy as np

_UNKNOWN_SIZE = 0xFFFFFFFF


def float_to_s16le(audio: np.ndarray) -> bytes:
    """float32 samples in [-1, 1] (clipped) -> 16-bit signed little-endian PCM."""
    clipped = np.clip(np.asarray(audio, dtype=np.float32), -1.0, 1.0)
    return (clipped * 32767.0).round().astype("<i2").tobytes()


def s16le_to_float(data: bytes) -> np.ndarray:
    """16-bit signed little-endian PCM -> float32 in [-1, 1). Raises ``ValueError`` on an odd
    byte count (a torn sample)."""
    if len(data) % 2:
        raise ValueError(f"16-bit PCM needs an even number of bytes, got {len(data)}")
    return np.frombuffer(data, dtype="<i2").astype(np.float32) / 32768.0


def streaming_wav_header(sample_rate: int, channels: int = 1, bits_per_sample: int = 16) -> bytes:
    """A 44-byte PCM WAV header whose sizes say "until the end of the stream"."""
    byte_rate = sample_rate * channels * bits_per_sample // 8
    block_align = channels * bits_per_sample // 8
    return (
        b"RIFF"
        + struct.pack("<I", _UNKNOWN_SIZE)
        + b"WAVEfmt "
        + struct.pack(
            "<IHHIIHH", 16, 1, channels, sample_rate, byte_rate, block_align, bits_per_sample
        )
        + b"data"
        + struct.pack("<I", _UNKNOWN_SIZE - 36)
    )


def wav_file_bytes(audio: np.ndarray, sample_rate: int) -> bytes:
    """A complete WAV file (exact sizes) for float32 mono ``audio``."""
    data = float_to_s16le(audio)
    header = bytearray(streaming_wav_header(sample_rate))
    header[4:8] = struct.pack("<I", 36 + len(data))
    header[40:44] = struct.pack("<I", len(data))
    return bytes(header) + data


def read_wav(data: bytes) -> tuple[np.ndarray, int]:
    """A PCM WAV file's samples as float32 mono in [-1, 1) (channels averaged) and its sample
    rate. Raises ``ValueError`` for anything but integer PCM of 8, 16, 24 or 32 bits."""
    try:
        with wave.open(io.BytesIO(data)) as reader:
            width, channels = reader.getsampwidth(), reader.getnchannels()
            rate = reader.getframerate()
            raw = reader.readframes(reader.getnframes())
    except (wave.Error, EOFError) as exc:
        raise ValueError(f"not a PCM WAV file ({exc})") from exc
    if width not in (1, 2, 3, 4):
        raise ValueError(f"a WAV of {8 * width}-bit samples; PCM of 8, 16, 24 or 32 bits only")
    if width == 1:  # unsigned
        samples = (np.frombuffer(raw, dtype=np.uint8).astype(np.float32) - 128.0) / 128.0
    elif width == 3:
        bytes3 = np.frombuffer(raw, dtype=np.uint8).reshape(-1, 3).astype(np.int32)
        values = bytes3[:, 0] | (bytes3[:, 1] << 8) | (bytes3[:, 2] << 16)
        values = np.where(values >= 1 << 23, values - (1 << 24), values)
        samples = values.astype(np.float32) / float(1 << 23)
    else:
        samples = np.frombuffer(raw, dtype=f"<i{width}").astype(np.float32) / 2.0 ** (8 * width - 1)
    if channels > 1:
        samples = samples.reshape(-1, channels).mean(axis=1, dtype=np.float32)
    return samples, rate
