import numpy as np
import pytest

from cadenza.edge.media.opus import OpusPacketEncoder
from cadenza.edge.streams.microphone import MicrophoneBuffer
from cadenza.edge.streams.protocol import ProtocolError


def _pcm(seconds, rate):
    t = np.arange(int(seconds * rate)) / rate
    return (0.3 * np.sin(2 * np.pi * 220 * t) * 32767).astype("<i2").tobytes()


def test_keeps_the_newest_seconds_and_take_empties_it():
    buffer = MicrophoneBuffer("pcm", 16000, max_seconds=1.0)
    for _ in range(5):
        buffer.append_bytes(_pcm(0.5, 16000))
    assert 1.0 <= buffer.seconds < 1.6
    audio = np.frombuffer(buffer.take(16000), "<f4")
    assert audio.size == 16000
    with pytest.raises(ProtocolError) as caught:
        buffer.take(16000)
    assert caught.value.code == "no_prompt_audio"


def test_take_resamples_to_the_codec_rate():
    buffer = MicrophoneBuffer("pcm", 16000, max_seconds=5.0)
    buffer.append_bytes(_pcm(1.0, 16000))
    audio = np.frombuffer(buffer.take(24000), "<f4")  # 1 s at 24 kHz
    assert abs(audio.size - 24000) <= 32 and np.abs(audio).max() > 0.2
    buffer.append_bytes(_pcm(0.1, 16000))
    with pytest.raises(ProtocolError) as caught:
        buffer.take(11111)
    assert caught.value.code == "invalid_audio"


def test_opus_packets_are_decoded_and_garbage_refused():
    buffer = MicrophoneBuffer("opus", 16000, max_seconds=5)
    assert buffer.sample_rate == 48000
    encoder = OpusPacketEncoder(16000)
    samples = np.frombuffer(_pcm(0.5, 16000), "<i2").astype(np.float32) / 32768
    for packet in encoder.encode(samples) + encoder.finish():
        buffer.append_bytes(packet)
    assert 0.45 < buffer.seconds < 0.6
    for garbage, kind in ((b"\xff\xfe\x00garbage", "opus"), (b"\x01\x02\x03", "pcm")):
        with pytest.raises(ProtocolError) as caught:
            MicrophoneBuffer(kind, 16000, 5).append_bytes(garbage)
        assert caught.value.code == "invalid_audio"


def test_a_limit_below_one_sample_keeps_only_the_newest_piece():
    buffer = MicrophoneBuffer("pcm", 16000, max_seconds=1e-5)
    buffer.append_bytes(_pcm(0.1, 16000))
    buffer.append_bytes(_pcm(0.1, 16000))
    assert buffer.seconds == pytest.approx(0.1)
