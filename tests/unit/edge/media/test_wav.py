import io
import wave

import numpy as np

from cadenza.edge.media.containers import open_encoder
from cadenza.edge.media.wav import float_to_s16le, streaming_wav_header, wav_file_bytes


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
