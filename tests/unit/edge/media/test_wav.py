import io
import struct
import wave

import numpy as np
import pytest

from cadenza.edge.media.containers import open_encoder
from cadenza.edge.media.wav import (
    float_to_s16le,
    read_wav,
    s16le_to_float,
    streaming_wav_header,
    wav_file_bytes,
)


def test_s16le_conversion_clips_and_rounds():
    pcm = np.frombuffer(float_to_s16le(np.array([0.0, 1.0, -1.0, 2.0, -3.0, 0.5])), "<i2")
    assert pcm.tolist() == [0, 32767, -32767, 32767, -32767, 16384]


def test_streaming_header_is_readable_by_wave():
    audio = np.sin(np.linspace(0, 100, 2400)).astype(np.float32) * 0.5
    body = streaming_wav_header(24000) + float_to_s16le(audio)
    with wave.open(io.BytesIO(body)) as reader:
        assert (reader.getframerate(), reader.getnchannels(), reader.getsampwidth()) == (
            24000,
            1,
            2,
        )
        frames = reader.readframes(10**9)
    assert len(frames) == 2 * 2400


def test_complete_file_has_exact_sizes():
    data = wav_file_bytes(np.zeros(480, np.float32), 24000)
    with wave.open(io.BytesIO(data)) as reader:
        assert reader.getnframes() == 480


def test_wav_encoder_sends_header_once_even_without_audio():
    encoder = open_encoder("wav", 24000)
    first = encoder.encode(np.zeros(10, np.float32))
    assert first.startswith(b"RIFF") and len(first) == 44 + 20
    assert len(encoder.encode(np.zeros(10, np.float32))) == 20
    assert encoder.finish() == b""
    empty = open_encoder("wav", 24000)
    assert empty.finish().startswith(b"RIFF")


def _wav(frames: bytes, width: int, channels: int = 1, rate: int = 44100) -> bytes:
    body = io.BytesIO()
    with wave.open(body, "wb") as writer:
        writer.setsampwidth(width)
        writer.setnchannels(channels)
        writer.setframerate(rate)
        writer.writeframes(frames)
    return body.getvalue()


def test_a_written_file_reads_back_as_its_16_bit_samples():
    audio = np.sin(np.linspace(0, 50, 4410)).astype(np.float32) * 0.7
    samples, rate = read_wav(wav_file_bytes(audio, 44100))
    assert rate == 44100 and samples.dtype == np.float32
    np.testing.assert_array_equal(samples, s16le_to_float(float_to_s16le(audio)))


def test_8_24_and_32_bit_samples_and_channels_averaged():
    eight, _ = read_wav(_wav(bytes([0, 128, 192]), 1))
    assert eight.tolist() == [-1.0, 0.0, 0.5]
    values = [-(1 << 23), 0, 1 << 22]
    raw24 = b"".join(struct.pack("<i", v)[:3] for v in values)
    assert read_wav(_wav(raw24, 3))[0].tolist() == [-1.0, 0.0, 0.5]
    raw32 = struct.pack("<3i", -(1 << 31), 0, 1 << 30)
    assert read_wav(_wav(raw32, 4))[0].tolist() == [-1.0, 0.0, 0.5]
    stereo = struct.pack("<4h", 16384, 0, -16384, -16384)
    samples, rate = read_wav(_wav(stereo, 2, channels=2, rate=16000))
    assert (samples.tolist(), rate) == ([0.25, -0.5], 16000)


def test_what_is_not_a_pcm_wav_is_refused():
    with pytest.raises(ValueError, match="not a PCM WAV"):
        read_wav(b"ID3 an mp3, say")
    float_wav = bytearray(_wav(b"\0" * 8, 4))
    float_wav[20:22] = struct.pack("<H", 3)  # WAVE_FORMAT_IEEE_FLOAT
    with pytest.raises(ValueError, match="not a PCM WAV"):
        read_wav(bytes(float_wav))
