"""Containers, resampling, Opus packets and PCM input, checked by decoding with PyAV."""

import io

import av
import numpy as np
import pytest

from cadenza.edge.media.containers import OPENAI_FORMATS, UnsupportedFormat, open_encoder
from cadenza.edge.media.opus import OpusError, OpusPacketDecoder, OpusPacketEncoder
from cadenza.edge.media.resampler import ResampleError, StreamResampler
from cadenza.edge.media.wav import s16le_to_float

RATE = 24000


def _sine(seconds, rate=RATE, freq=440.0):
    t = np.arange(int(seconds * rate)) / rate
    return (0.5 * np.sin(2 * np.pi * freq * t)).astype(np.float32)


def _encode_in_chunks(fmt, audio, chunk=4800):
    encoder = open_encoder(fmt, RATE)
    out = b"".join(encoder.encode(audio[i : i + chunk]) for i in range(0, len(audio), chunk))
    return out + encoder.finish()


def _decoded_seconds(data):
    container = av.open(io.BytesIO(data))
    samples, rate = 0, 1
    for frame in container.decode(container.streams.audio[0]):
        samples, rate = samples + frame.samples, frame.sample_rate
    return samples / rate


@pytest.mark.parametrize("fmt", OPENAI_FORMATS)
def test_every_format_round_trips_with_the_right_duration(fmt):
    data = _encode_in_chunks(fmt, _sine(2.0))
    seconds = len(data) / 2 / RATE if fmt == "pcm" else _decoded_seconds(data)
    assert abs(seconds - 2.0) <= 0.25


@pytest.mark.parametrize("fmt", ["mp3", "opus", "aac", "flac"])
def test_muxed_formats_emit_bytes_before_the_end(fmt):
    encoder = open_encoder(fmt, RATE)
    audio = _sine(2.0)
    emitted = sum(len(encoder.encode(audio[i : i + 4800])) for i in range(0, len(audio), 4800))
    assert emitted > 0  # streamed as produced, not all at finish
    assert encoder.finish()
    assert encoder.finish() == b""  # finishing twice is harmless


def test_empty_stream_still_makes_a_valid_file():
    data = open_encoder("flac", RATE).finish()
    assert data.startswith(b"fLaC")


def test_unknown_format():
    with pytest.raises(UnsupportedFormat):
        open_encoder("ogg-vorbis", RATE)


@pytest.mark.parametrize(("src", "dst"), [(24000, 48000), (48000, 24000), (16000, 24000)])
def test_chunked_resampling_equals_one_shot_and_has_no_clicks(src, dst):
    audio = _sine(1.0, rate=src)
    one_shot = StreamResampler(src, dst)
    whole = np.concatenate([one_shot.process(audio), one_shot.flush()])
    chunked = StreamResampler(src, dst)
    pieces = [chunked.process(audio[i : i + 317]) for i in range(0, len(audio), 317)]
    joined = np.concatenate([*pieces, chunked.flush()])
    assert abs(len(joined) - dst) <= 64
    n = min(len(whole), len(joined))
    assert np.abs(whole[:n] - joined[:n]).max() < 1e-4
    # a 440 Hz sine of amplitude 0.5 moves at most this much per sample (plus filter ripple)
    limit = 0.5 * 2 * np.pi * 440 / dst * 1.5
    settled = joined[200 : n - 200]
    assert np.abs(np.diff(settled)).max() < limit


def test_resampler_refuses_bad_rates_and_shapes():
    with pytest.raises(ResampleError):
        StreamResampler(44000, 24000)
    with pytest.raises(ResampleError):
        StreamResampler(24000, 48000).process(np.zeros((2, 10), np.float32))


def test_opus_packets_round_trip_and_corrupt_packets_are_refused():
    encoder = OpusPacketEncoder(RATE)
    audio = _sine(1.0)
    packets = [p for i in range(0, len(audio), 2400) for p in encoder.encode(audio[i : i + 2400])]
    packets += encoder.finish()
    assert len(packets) == 50  # 20 ms each
    decoder = OpusPacketDecoder()
    decoded = np.concatenate([decoder.decode(p) for p in packets[:10]])
    for garbage in (b"", b"\xff\xff\xff\xffgarbage"):
        with pytest.raises(OpusError):
            decoder.decode(garbage)
    decoded = np.concatenate([decoded, *(decoder.decode(p) for p in packets[10:])])
    assert decoded.size == 48000
    assert 0.3 < np.abs(decoded).max() < 0.7


def test_pcm_input():
    data = np.array([0, 16384, -32768], dtype="<i2").tobytes()
    assert s16le_to_float(data).tolist() == [0.0, 0.5, -1.0]
    with pytest.raises(ValueError, match="even"):
        s16le_to_float(b"\x00\x01\x02")


@pytest.mark.parametrize("speed", [0.25, 0.5, 1.5, 2.0, 4.0])
def test_tempo_changes_duration_not_pitch(speed):
    from cadenza.edge.media.tempo import TempoChanger

    audio = _sine(2.0)
    tempo = TempoChanger(RATE, speed)
    out = np.concatenate(
        [*(tempo.process(audio[i : i + 4800]) for i in range(0, len(audio), 4800)), tempo.flush()]
    )
    assert abs(len(out) / RATE - 2.0 / speed) < 0.02 * 2.0 / speed + 0.01
    window = out[: RATE // 4] * np.hanning(RATE // 4)
    peak_hz = np.argmax(np.abs(np.fft.rfft(window))) * 4
    assert abs(peak_hz - 440) <= 8


@pytest.mark.parametrize("speed", [0.1, 5.0])
def test_tempo_refuses_out_of_range_speed(speed):
    from cadenza.edge.media.tempo import TempoChanger

    with pytest.raises(ValueError):
        TempoChanger(RATE, speed)
