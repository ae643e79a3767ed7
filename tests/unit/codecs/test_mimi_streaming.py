"""Streaming Mimi decode equals offline decode for any chunking, with streams interleaved at
different positions and slots reused; bad input is refused without touching any stream."""

from __future__ import annotations

import random

import pytest
import torch

from cadenza.codecs import CodecError
from cadenza.codecs.mimi import MimiCodec
from cadenza.codecs.mimi_streaming import MimiStreamingDecoder, SlidingWindowTransformer
from cadenza.codecs.slot_batch import SlotBatch
from tests.unit.codecs.test_mimi import HOP, random_codes, tiny_mimi_codec


@pytest.fixture(scope="module")
def codec() -> MimiCodec:
    return tiny_mimi_codec()


def _codes(frames: int, seed: int) -> torch.Tensor:
    return random_codes(frames, seed)[0]


def _assert_matches_offline(codec: MimiCodec, codes: torch.Tensor, pieces: list) -> None:
    got = torch.cat(pieces) if pieces else torch.zeros(0)
    expected = codec.decode(codes[None])[0]
    assert got.shape == expected.shape
    if expected.numel():
        scale = expected.abs().max()
        assert (got - expected).abs().max() / scale < 1e-5


@pytest.mark.parametrize("chunk", [1, 3, 16])
def test_fixed_chunks_give_each_frames_audio_at_once(codec, chunk) -> None:
    decoder = codec.streaming_decoder(max_streams=1)
    codes = _codes(16, seed=chunk)  # 32 positions at 25 Hz: the 6-position window slides
    assert decoder.open() == 0
    pieces = []
    for start in range(0, 16, chunk):
        piece = decoder.decode({0: codes[:, start : start + chunk]})[0]
        assert piece.shape == (codes[:, start : start + chunk].shape[1] * HOP,)
        pieces.append(piece)
    assert decoder.close(0) is None  # nothing held back
    _assert_matches_offline(codec, codes, pieces)


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
    close(); later streams reuse freed slots. One is cancelled half-way."""
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


def test_the_transformer_matches_its_module_for_any_chunking(codec) -> None:
    """The sliding-window attention alone, against ``MimiTransformerModel`` (the codec's audio
    shrinks attention errors; its hidden states do not)."""
    transformer = codec.model.decoder.decoder_transformer
    steps = 23  # almost four windows of 6
    x = torch.randn(2, 32, steps, generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        expected = transformer(x.transpose(1, 2)).last_hidden_state.transpose(1, 2)
        stage = SlidingWindowTransformer(transformer, max_streams=3)
        slots = SlotBatch.on([2, 0], "cpu")
        outs: list[list[torch.Tensor]] = [[], []]
        cuts = [[0, 1, 2, 9, 9, 16, 23], [0, 5, 6, 7, 20, 23, 23]]
        for step in range(6):
            pieces = [x[b, :, cuts[b][step] : cuts[b][step + 1]] for b in range(2)]
            lengths = [p.shape[1] for p in pieces]
            batch = torch.zeros(2, 32, max(lengths))
            for b, piece in enumerate(pieces):
                batch[b, :, : lengths[b]] = piece
            out, out_lengths = stage.forward(batch, lengths, slots, [False, False])
            assert out_lengths == lengths
            for b in range(2):
                outs[b].append(out[b, :, : lengths[b]])
    for b in range(2):
        torch.testing.assert_close(torch.cat(outs[b], dim=1), expected[b], atol=1e-5, rtol=1e-5)


def test_bad_input_is_refused_and_leaves_other_streams_exact(codec) -> None:
    decoder = codec.streaming_decoder(max_streams=2)
    good = _codes(12, seed=8)
    assert (decoder.open(), decoder.open()) == (0, 1)
    pieces = [decoder.decode({0: good[:, :5]})[0]]
    bad_inputs = [
        torch.full((8, 3), 64),  # out of range
        torch.full((8, 3), -1),
        torch.zeros(7, 3, dtype=torch.long),  # wrong codebook count
        torch.zeros(8, dtype=torch.long),  # wrong rank
        torch.zeros(8, 3),  # not integers
    ]
    for bad in bad_inputs:
        with pytest.raises(CodecError):
            decoder.decode({0: good[:, 5:7], 1: bad})
    pieces.append(decoder.decode({0: good[:, 5:]})[0])
    decoder.close(0)
    _assert_matches_offline(codec, good, pieces)


def test_slot_misuse_is_refused(codec) -> None:
    decoder = MimiStreamingDecoder(codec, max_streams=2)
    with pytest.raises(CodecError, match="not open"):
        decoder.decode({0: _codes(3, 0)})
    assert (decoder.open(), decoder.open()) == (0, 1)
    with pytest.raises(CodecError, match="in use"):
        decoder.open()
    decoder.release(1)
    decoder.release(1)  # idempotent
    with pytest.raises(CodecError, match="not open"):
        decoder.close(1)
    assert decoder.open() == 1


def test_the_window_state_grows_with_the_slots_opened(codec) -> None:
    """The transformer's window is held for the slots opened so far: opening a ninth stream
    grows it, and streams decoding across the growth stay exact."""
    decoder = codec.streaming_decoder(max_streams=12)
    stage = next(s for s in decoder._stages if isinstance(s, SlidingWindowTransformer))
    assert stage.keys.shape[0] == 4
    codes = [_codes(8, seed=300 + i) for i in range(9)]
    pieces: list[list[torch.Tensor]] = [[] for _ in codes]
    slots = [decoder.open() for _ in range(3)]
    for start in range(0, 8, 2):
        if start == 4:  # six more streams join half-way: the window grows past 4 slots
            slots += [decoder.open() for _ in range(6)]
        chunks = {
            slot: codes[i][:, start - (4 if i >= 3 else 0) :][:, :2]
            for i, slot in enumerate(slots)
            if i < 3 or start >= 4
        }
        out = decoder.decode(chunks)
        for i, slot in enumerate(slots):
            if slot in out:
                pieces[i].append(out[slot])
    assert stage.keys.shape[0] == 12  # 4, then 8 for the fifth slot, then at most max_streams
    for i in range(3):
        _assert_matches_offline(codec, codes[i], pieces[i])
    for i in range(3, 9):
        _assert_matches_offline(codec, codes[i][:, :4], pieces[i])
