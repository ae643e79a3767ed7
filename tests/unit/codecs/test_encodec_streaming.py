"""Streaming decode equals offline decode for any chunking, with slots opening and closing
independently, and bad input is refused without touching any stream."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from cadenza.codecs import CodecError, load_codec
from cadenza.codecs.encodec_streaming import EncodecStreamingDecoder
from cadenza.kernels import cpu_lstm
from cadenza.kernels.cpu_lstm import NativeLstm
from cadenza.kernels.native import loader


@pytest.fixture(scope="module")
def codec():
    return load_codec("encodec_24khz", seed=0)


def _codes(frames, seed):
    return torch.randint(0, 1024, (8, frames), generator=torch.Generator().manual_seed(seed))


def _assert_matches_offline(codec, codes, pieces):
    got = torch.cat(pieces) if pieces else torch.zeros(0)
    expected = codec.decode(codes[None])[0]
    assert got.shape == expected.shape
    if not expected.numel():
        return
    scale = expected.abs().max().clamp(min=1e-6)
    assert ((got - expected).abs().max() / scale) < 1e-4


stream_plans = st.lists(
    st.tuples(
        st.integers(0, 4),  # the tick the stream opens at
        st.lists(st.integers(0, 9), min_size=1, max_size=8),  # its chunk sizes (0: no frames)
        st.booleans(),  # end with a final chunk (True) or with close() (False)
    ),
    min_size=1,
    max_size=3,
)


@settings(
    max_examples=12,
    deadline=None,
    phases=[Phase.explicit, Phase.reuse, Phase.generate],
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(plans=stream_plans)
def test_random_chunkings_of_interleaved_streams(codec, plans):
    decoder = EncodecStreamingDecoder(codec, max_streams=len(plans))
    codes = {n: _codes(sum(sizes), seed=n) for n, (_, sizes, _) in enumerate(plans)}
    pieces: dict[int, list[torch.Tensor]] = {n: [] for n in codes}
    slots: dict[int, int] = {}  # stream -> its slot
    for tick in range(max(start + len(sizes) for start, sizes, _ in plans) + 1):
        chunks, final = {}, set()
        for n, (start, sizes, ends_final) in enumerate(plans):
            if tick == start:
                slots[n] = decoder.open()
            index = tick - start
            if 0 <= index < len(sizes):
                done = sum(sizes[:index])
                chunks[slots[n]] = codes[n][:, done : done + sizes[index]]
                if index == len(sizes) - 1 and ends_final:
                    final.add(slots[n])
        streams = {slot: n for n, slot in slots.items()}
        for slot, audio in decoder.decode(chunks, frozenset(final)).items():
            pieces[streams[slot]].append(audio)
        for n, (start, sizes, ends_final) in enumerate(plans):
            if tick == start + len(sizes) and not ends_final:
                tail = decoder.close(slots[n])
                if tail is not None:
                    pieces[n].append(tail)
    assert not decoder.open_slots
    for n, stream_codes in codes.items():
        _assert_matches_offline(codec, stream_codes, pieces[n])


@pytest.mark.parametrize("native", [True, False])
def test_ragged_calls_match_offline_on_either_lstm(codec, monkeypatch, native):
    """Streams whose chunks differ in length share every call, through the native LSTM
    kernel and through torch's (what a machine without a C++ compiler runs)."""
    if not native:
        monkeypatch.setattr(NativeLstm, "build", classmethod(lambda cls, lstm, dtype: None))
    decoder = EncodecStreamingDecoder(codec, max_streams=3)
    kernel = native and loader.load(cpu_lstm.LIBRARY) is not None
    assert (decoder._stages[1].native is not None) == kernel
    plans = [[9, 6, 7, 8], [3, 12, 1, 14], [15, 2, 8, 5]]
    codes = [_codes(sum(plan), seed) for seed, plan in enumerate(plans)]
    slots = [decoder.open() for _ in plans]
    pieces: list[list[torch.Tensor]] = [[] for _ in plans]
    for tick in range(4):
        chunks = {}
        for n, plan in enumerate(plans):
            done = sum(plan[:tick])
            chunks[slots[n]] = codes[n][:, done : done + plan[tick]]
        out = decoder.decode(chunks)
        for n, slot in enumerate(slots):
            pieces[n].append(out[slot])
    for n, slot in enumerate(slots):
        tail = decoder.close(slot)
        if tail is not None:
            pieces[n].append(tail)
        _assert_matches_offline(codec, codes[n], pieces[n])


@pytest.mark.parametrize("chunk", [1, 2, 6, 7, 15])
def test_fixed_chunk_sizes_including_shorter_than_the_first_context(codec, chunk):
    decoder = EncodecStreamingDecoder(codec, max_streams=1)
    codes = _codes(40, seed=chunk)
    assert decoder.open() == 0
    pieces = [decoder.decode({0: codes[:, i : i + chunk]})[0] for i in range(0, 40, chunk)]
    first_audio = next(i for i, piece in enumerate(pieces) if piece.numel())
    assert (first_audio + 1) * chunk >= 7  # nothing before the first conv has 7 frames
    tail = decoder.close(0)
    assert tail is None
    _assert_matches_offline(codec, codes, pieces)


@pytest.mark.parametrize("frames", [1, 3, 6])
def test_streams_shorter_than_the_first_context_are_flushed_at_close(codec, frames):
    decoder = EncodecStreamingDecoder(codec, max_streams=1)
    codes = _codes(frames, seed=frames)
    assert decoder.open() == 0
    assert decoder.decode({0: codes})[0].numel() == 0  # held back: needs 7 frames to reflect
    tail = decoder.close(0)
    _assert_matches_offline(codec, codes, [tail])


def test_a_slot_is_reusable_after_close(codec):
    decoder = EncodecStreamingDecoder(codec, max_streams=1)
    for seed in (1, 2):
        codes = _codes(20, seed)
        assert decoder.open() == 0
        pieces = [decoder.decode({0: codes[:, :9]})[0], decoder.decode({0: codes[:, 9:]})[0]]
        decoder.close(0)
        _assert_matches_offline(codec, codes, pieces)


def test_bad_input_is_refused_and_leaves_other_streams_exact(codec):
    decoder = EncodecStreamingDecoder(codec, max_streams=2)
    good = _codes(30, seed=3)
    assert (decoder.open(), decoder.open()) == (0, 1)
    pieces = [decoder.decode({0: good[:, :10]})[0]]
    bad_inputs = [
        torch.full((8, 5), 1024),  # out of range
        torch.full((8, 5), -1),
        torch.zeros(7, 5, dtype=torch.long),  # wrong codebook count
        torch.zeros(8, dtype=torch.long),  # wrong rank
        torch.zeros(8, 5),  # not integers
    ]
    for bad in bad_inputs:
        with pytest.raises(CodecError):
            decoder.decode({0: good[:, 10:12], 1: bad})
    pieces.append(decoder.decode({0: good[:, 10:]})[0])
    decoder.close(0)
    _assert_matches_offline(codec, good, pieces)


def test_slot_misuse_is_refused(codec):
    decoder = EncodecStreamingDecoder(codec, max_streams=2)
    with pytest.raises(CodecError, match="not open"):
        decoder.decode({0: _codes(3, 0)})
    assert (decoder.open(), decoder.open()) == (0, 1)
    with pytest.raises(CodecError, match="in use"):
        decoder.open()
    decoder.release(1)
    decoder.release(1)  # idempotent
    with pytest.raises(CodecError, match="not open"):
        decoder.close(1)
    assert decoder.open() == 1  # a released slot is free again


def test_bf16_streaming_is_within_bf16_rounding_of_float32(codec) -> None:
    """The CPU's bf16 decoder: float32 audio out, chunking still immaterial (to bf16
    rounding), and close to the float32 decode (docs/benchmarks.md: about 49 dB SNR)."""
    codes = [_codes(40, seed) for seed in range(3)]
    reference = [codec.decode(c[None])[0] for c in codes]
    decoder = EncodecStreamingDecoder(codec, 3, torch.bfloat16)
    slots = [decoder.open() for _ in codes]
    pieces: dict[int, list[torch.Tensor]] = {slot: [] for slot in slots}
    for start, stop in [(0, 9), (9, 10), (10, 25), (25, 40)]:
        final = frozenset(slots) if stop == 40 else frozenset()
        chunk = {s: c[:, start:stop] for s, c in zip(slots, codes, strict=True)}
        out = decoder.decode(chunk, final)
        for slot in slots:
            assert out[slot].dtype == torch.float32
            pieces[slot].append(out[slot])
    for slot, expected in zip(slots, reference, strict=True):
        got = torch.cat(pieces[slot])
        assert got.shape == expected.shape
        noise = ((got - expected) ** 2).mean()
        snr_db = 10 * torch.log10((expected**2).mean() / noise)
        assert snr_db > 35.0


def test_snac_refuses_bf16_streaming() -> None:
    snac = load_codec("snac_24khz", seed=0, noise=False)
    assert snac.streaming_dtypes == (torch.float32,)
    with pytest.raises(CodecError, match="float32 only"):
        snac.streaming_decoder(1, torch.bfloat16)
