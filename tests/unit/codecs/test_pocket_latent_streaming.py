"""Streaming Pocket TTS audio tokenizer decode equals offline decode (fade-in included) for any
chunking, with streams interleaved at different positions and slots reused; bad input is
refused without touching any stream."""

from __future__ import annotations

import random

import pytest
import torch

from cadenza.codecs import CodecError
from cadenza.codecs.pocket_latent import PocketLatentCodec
from cadenza.codecs.pocket_latent_streaming import PocketLatentStreamingDecoder
from tests.unit.codecs.test_pocket_latent import FRAME, random_latent_codes, tiny_pocket_model

# Streaming runs the same layers on other tensor shapes (the attention over a window plus the
# chunk, each conv over its carried history plus the chunk), so its sums round differently
# from the offline pass: equal to under 1e-6 of the audio's peak (measured), not bit for bit.
RELATIVE_TOLERANCE = 2e-6


@pytest.fixture(scope="module")
def codec() -> PocketLatentCodec:
    return PocketLatentCodec(tiny_pocket_model())


def _codes(frames: int, seed: int) -> torch.Tensor:
    return random_latent_codes(frames, seed)[0]


def _assert_matches_offline(codec: PocketLatentCodec, codes: torch.Tensor, pieces: list) -> None:
    got = torch.cat(pieces) if pieces else torch.zeros(0)
    expected = codec.decode(codes[None])[0]
    assert got.shape == expected.shape
    if expected.numel():
        assert (got - expected).abs().max() <= RELATIVE_TOLERANCE * expected.abs().max()
        assert got[0] == 0  # faded in from silence


@pytest.mark.parametrize("chunk", [1, 3, 16])
def test_fixed_chunks_give_each_frames_audio_at_once(codec, chunk) -> None:
    decoder = codec.streaming_decoder(max_streams=1)
    codes = _codes(16, seed=chunk)  # 32 positions at 25 Hz: the 6-position window slides
    assert decoder.open() == 0
    pieces = []
    for start in range(0, 16, chunk):
        piece = decoder.decode({0: codes[:, start : start + chunk]})[0]
        assert piece.shape == (codes[:, start : start + chunk].shape[1] * FRAME,)
        pieces.append(piece)
    assert decoder.close(0) is None  # nothing held back
    _assert_matches_offline(codec, codes, pieces)


def test_a_fade_spanning_chunks_is_applied_across_them(codec) -> None:
    """A 0.2 s fade (4800 samples, 2.5 frames) reaches into a stream's third chunk of one
    frame; empty chunks before and between change nothing."""
    slow = PocketLatentCodec(codec.model, fade_in_s=0.2)
    decoder = slow.streaming_decoder(max_streams=1)
    codes = _codes(6, seed=4)
    decoder.open()
    pieces = [decoder.decode({0: codes[:, :0]})[0]]
    for start in range(6):
        pieces.append(decoder.decode({0: codes[:, start : start + 1]})[0])
        pieces.append(decoder.decode({0: codes[:, :0]})[0])
    _assert_matches_offline(slow, codes, pieces)
    got, expected = torch.cat(pieces), slow.decode(codes[None])[0]
    unfaded = codec.decode(codes[None])[0]
    assert (expected[:4800] - unfaded[:4800]).abs().max() > 0.01 * unfaded.abs().max()
    assert (got - expected).abs().max() <= RELATIVE_TOLERANCE * expected.abs().max()


def _chunk_sizes(total: int, rng: random.Random) -> list[int]:
    sizes = []
    while total > 0:
        size = min(total, rng.choice([0, 1, 1, 2, 3, 5, 8]))
        sizes.append(size)
        total -= size
    return sizes


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_random_chunks_of_interleaved_streams_with_slot_reuse(codec, seed) -> None:
    """Three slots, five streams: each opens at its own tick (so streams sit at different
    positions in the same batch), takes random chunks, and ends with a final chunk or with
    close(); later streams reuse freed slots, and their audio is faded in afresh. One is
    cancelled half-way."""
    rng = random.Random(seed)
    frames = [14, 9, 17, 6, 11]
    starts = [0, 2, 3, 9, 12]
    plans = [_chunk_sizes(n, rng) for n in frames]
    codes = [_codes(n, seed=100 * seed + i) for i, n in enumerate(frames)]
    cancelled = 3
    decoder = codec.streaming_decoder(max_streams=3)
    pieces: list[list[torch.Tensor]] = [[] for _ in frames]
    slot_of: dict[int, int] = {}
    done: set[int] = set()
    sent = [0] * len(frames)
    for tick in range(60):
        for n, start in enumerate(starts):
            if tick == start:
                slot_of[n] = decoder.open()
        chunks, final = {}, set()
        for n, slot in slot_of.items():
            step = tick - starts[n]
            if n in done or step >= len(plans[n]):
                continue
            size = plans[n][step]
            chunks[slot] = codes[n][:, sent[n] : sent[n] + size]
            sent[n] += size
            if step == len(plans[n]) - 1 and n % 2 == 0:
                final.add(slot)
        stream_of = {slot: n for n, slot in slot_of.items() if n not in done}
        for slot, audio in decoder.decode(chunks, frozenset(final)).items():
            pieces[stream_of[slot]].append(audio)
        for n, slot in list(slot_of.items()):
            if n in done:
                continue
            if n == cancelled and tick - starts[n] == len(plans[n]) // 2:
                decoder.release(slot)
                done.add(n)
            elif slot in final:
                done.add(n)
            elif tick - starts[n] == len(plans[n]) - 1:
                assert decoder.close(slot) is None
                done.add(n)
        if len(done) == len(frames):
            break
    assert not decoder.open_slots
    assert len(set(slot_of.values())) < len(frames)  # freed slots were reused
    for n in range(len(frames)):
        if n != cancelled:
            _assert_matches_offline(codec, codes[n], pieces[n])


def test_a_released_slot_starts_afresh(codec) -> None:
    decoder = codec.streaming_decoder(max_streams=1)
    assert decoder.open() == 0
    decoder.decode({0: _codes(7, seed=5)})
    decoder.release(0)
    codes = _codes(10, seed=6)
    assert decoder.open() == 0
    pieces = [decoder.decode({0: codes[:, :4]})[0], decoder.decode({0: codes[:, 4:]})[0]]
    _assert_matches_offline(codec, codes, pieces)


def test_bad_input_is_refused_and_leaves_other_streams_exact(codec) -> None:
    decoder = codec.streaming_decoder(max_streams=2)
    good = _codes(12, seed=8)
    assert (decoder.open(), decoder.open()) == (0, 1)
    pieces = [decoder.decode({0: good[:, :5]})[0]]
    bad_inputs = [
        torch.full((32, 3), 2**31),  # outside int32
        torch.full((32, 3), 0x7FC00000),  # NaN
        torch.zeros(31, 3, dtype=torch.long),  # wrong latent size
        torch.zeros(32, dtype=torch.long),  # wrong rank
        torch.zeros(32, 3),  # floats, not bit patterns
    ]
    for bad in bad_inputs:
        with pytest.raises(CodecError):
            decoder.decode({0: good[:, 5:7], 1: bad})
    pieces.append(decoder.decode({0: good[:, 5:]})[0])
    decoder.close(0)
    _assert_matches_offline(codec, good, pieces)


def test_slot_misuse_is_refused(codec) -> None:
    decoder = PocketLatentStreamingDecoder(codec, max_streams=2)
    with pytest.raises(CodecError, match="not open"):
        decoder.decode({0: _codes(3, 0)})
    assert (decoder.open(), decoder.open()) == (0, 1)
    with pytest.raises(CodecError, match="all 2 streaming slots are in use"):
        decoder.open()
    decoder.release(1)
    decoder.release(1)  # idempotent
    with pytest.raises(CodecError, match="not open"):
        decoder.close(1)
    assert decoder.open() == 1


def test_bf16_streaming_is_the_float32_decode_to_bf16_rounding(codec) -> None:
    """The CPU's bf16 matrix units (``cpu.codec_dtype``): weights, activations and state in
    bf16 on a copy of the decoder (the offline decode stays float32), audio out in float32,
    the same length chunk for chunk."""
    codes = _codes(12, seed=5)
    expected = codec.decode(codes[None])[0]
    outputs = []
    for chunk in (1, 4):
        decoder = codec.streaming_decoder(max_streams=1, compute_dtype=torch.bfloat16)
        slot = decoder.open()
        pieces = [
            decoder.decode({slot: codes[:, start : start + chunk]})[slot]
            for start in range(0, 12, chunk)
        ]
        got = torch.cat(pieces)
        assert got.dtype == torch.float32 and got.shape == expected.shape
        assert (got - expected).abs().max() <= 0.05 * expected.abs().max()
        outputs.append(got)
    assert (outputs[0] - outputs[1]).abs().max() <= 0.05 * expected.abs().max()
    assert torch.equal(codec.decode(codes[None])[0], expected)  # the float32 model untouched
