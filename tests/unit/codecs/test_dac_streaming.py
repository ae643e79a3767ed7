"""Streaming DAC decoding against offline decoding: any chunking, streams joining and leaving
a running batch, the lookahead held back, bad input refused without harm."""

from __future__ import annotations

import copy
import random

import pytest
import torch

from cadenza.codecs import CodecError, load_codec
from cadenza.codecs.dac import DacCodec
from cadenza.codecs.dac_streaming import DacStreamingDecoder
from cadenza.codecs.weight_norm import fold_weight_norm
from tests.support.dac_checkpoints import (
    SMALL_HOP,
    SMALL_LOOKAHEAD,
    dac_44khz_layout,
    random_dac,
    save_legacy_checkpoint,
    small_dac_config,
)

# Streamed and offline audio (about unit amplitude) differ by float32 rounding only: convs
# computed another way (up to 6e-6 apart over 40 random chunkings).
TOLERANCE = {"atol": 2e-5, "rtol": 1e-5}


@pytest.fixture(scope="module")
def codec(tmp_path_factory) -> DacCodec:
    directory = tmp_path_factory.mktemp("dac")
    loaded = load_codec(str(save_legacy_checkpoint(random_dac(small_dac_config(), 3), directory)))
    assert isinstance(loaded, DacCodec)
    return loaded


def _codes(frames: int, seed: int) -> torch.Tensor:
    return torch.randint(0, 64, (4, frames), generator=torch.Generator().manual_seed(seed))


def _chunks(total: int, rng: random.Random) -> list[int]:
    sizes = []
    while total > 0:
        size = min(total, rng.choice([0, 1, 1, 2, 3, 5, 8]))
        sizes.append(size)
        total -= size
    return sizes


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_streaming_equals_offline_for_any_chunking_and_interleaving(codec, seed) -> None:
    rng = random.Random(seed)
    lengths = [1, 2, 13, 30]
    codes = [_codes(n, seed=10 * seed + i) for i, n in enumerate(lengths)]
    decoder = codec.streaming_decoder(max_streams=4)
    slots = [decoder.open() for _ in lengths]
    plans = [_chunks(n, rng) for n in lengths]
    sent = [0] * len(lengths)
    audio: list[list[torch.Tensor]] = [[] for _ in lengths]
    while any(plans):
        batch, final = {}, set()
        for i, plan in enumerate(plans):
            if plan and rng.random() < 0.7:
                size = plan.pop(0)
                batch[slots[i]] = codes[i][:, sent[i] : sent[i] + size]
                sent[i] += size
                if not plan:
                    final.add(slots[i])
        for slot, samples in decoder.decode(batch, frozenset(final)).items():
            audio[slots.index(slot)].append(samples)
    assert decoder.open_slots == frozenset()
    for i, n in enumerate(lengths):
        streamed = torch.cat(audio[i])
        assert streamed.shape == (n * SMALL_HOP,)
        torch.testing.assert_close(streamed, codec.decode(codes[i][None])[0], **TOLERANCE)


def test_streams_join_and_leave_a_running_batch(codec) -> None:
    """Streams start while others run, in the slots the finished and cancelled ones free;
    each ends by a final chunk, by ``close`` (a flush of no codes), or is cancelled."""
    rng = random.Random(7)
    decoder = codec.streaming_decoder(max_streams=3)
    # (frames, first step, how it ends)
    plan = [(25, 0, "final"), (4, 0, "cancel"), (17, 1, "close"), (9, 3, "final"), (21, 5, "final")]
    codes = [_codes(n, seed=100 + i) for i, (n, _, _) in enumerate(plan)]
    slot_of: dict[int, int] = {}  # the streams now open
    given: dict[int, int] = {}  # every stream's slot
    sent = [0] * len(plan)
    audio: list[list[torch.Tensor]] = [[] for _ in plan]
    done: set[int] = set()
    step = 0
    while len(done) < len(plan):
        for i, (_, start, _) in enumerate(plan):
            free = len(decoder.open_slots) < decoder.max_streams
            if free and start <= step and i not in slot_of and i not in done:
                slot_of[i] = given[i] = decoder.open()
        batch, final, to_close = {}, set(), []
        for i, slot in slot_of.items():
            frames, _, ending = plan[i]
            if ending == "cancel" and sent[i] >= 2:
                decoder.release(slot)
                continue
            size = min(frames - sent[i], rng.choice([0, 1, 2, 3, 6]))
            batch[slot] = codes[i][:, sent[i] : sent[i] + size]
            sent[i] += size
            if sent[i] == frames and ending == "final":
                final.add(slot)
            elif sent[i] == frames:
                to_close.append(i)
        for slot, samples in decoder.decode(batch, frozenset(final)).items():
            audio[next(i for i, s in slot_of.items() if s == slot)].append(samples)
        for i in to_close:
            tail = decoder.close(slot_of[i])
            audio[i].append(tail if tail is not None else torch.zeros(0))
        for i, slot in list(slot_of.items()):
            if slot not in decoder.open_slots:
                done.add(i)
                del slot_of[i]
        step += 1
    assert decoder.open_slots == frozenset()
    assert given[1] in (given[3], given[4])  # the cancelled stream's slot carried another
    for i, (frames, _, ending) in enumerate(plan):
        if ending == "cancel":
            continue
        streamed = torch.cat(audio[i])
        assert streamed.shape == (frames * SMALL_HOP,)
        torch.testing.assert_close(streamed, codec.decode(codes[i][None])[0], **TOLERANCE)


def test_the_decoder_holds_back_its_lookahead(codec) -> None:
    decoder = codec.streaming_decoder(max_streams=1)
    assert isinstance(decoder, DacStreamingDecoder)
    assert decoder.lookahead_samples == SMALL_LOOKAHEAD
    slot = decoder.open()
    first = decoder.decode({slot: _codes(20, seed=0)})[slot]
    assert first.numel() == 20 * SMALL_HOP - SMALL_LOOKAHEAD
    assert decoder.close(slot).numel() == SMALL_LOOKAHEAD  # type: ignore[union-attr]
    assert decoder.open_slots == frozenset()


def test_the_44khz_layout_looks_ahead_4757_samples() -> None:
    """descript/dac_44khz's rates and codebooks: 86.13 frames a second, 10 frames of
    lookahead; it streams as exactly as float32 decodes offline (both measured against a
    float64 decode: through this deep a decoder float32 rounding reaches ~2e-5)."""
    model = random_dac(dac_44khz_layout(), seed=0)
    fold_weight_norm(model)
    codec = DacCodec(model)
    assert (codec.hop_length, codec.frame_rate, codec.num_codebooks) == (512, 44100 / 512, 9)
    decoder = codec.streaming_decoder(max_streams=1)
    assert (decoder.lookahead_samples, codec.lookahead_frames) == (4757, 10)
    codes = torch.randint(0, 1024, (9, 13), generator=torch.Generator().manual_seed(0))
    slot = decoder.open()
    pieces = [decoder.decode({slot: codes[:, :11]})[slot]]
    assert pieces[0].numel() == 11 * 512 - 4757
    pieces.append(decoder.decode({slot: codes[:, 11:]}, final=frozenset({slot}))[slot])
    with torch.no_grad():
        exact = copy.deepcopy(model).double().decode(audio_codes=codes[None]).audio_values[0]
    offline_error = (codec.decode(codes[None])[0].double() - exact).abs().max()
    streamed_error = (torch.cat(pieces).double() - exact).abs().max()
    assert streamed_error <= 2 * offline_error + 1e-6, (streamed_error, offline_error)


def test_bad_input_is_refused_and_changes_nothing(codec) -> None:
    decoder = codec.streaming_decoder(max_streams=1)
    slot = decoder.open()
    good = _codes(9, seed=4)
    first = decoder.decode({slot: good[:, :4]})[slot]
    for bad, message in [
        (torch.full((4, 2), 64), r"must lie in \[0, 64\)"),
        (torch.zeros(3, 2, dtype=torch.long), r"must be \[batch, 4, frames\]"),
        (torch.zeros(4, 2), "must be integers"),
        (torch.zeros(4), r"must be \[codebooks, frames\]"),
    ]:
        with pytest.raises(CodecError, match=message):
            decoder.decode({slot: bad})
    with pytest.raises(CodecError, match="slots are in use"):
        decoder.open()
    with pytest.raises(CodecError, match="not open"):
        decoder.decode({slot + 1: good})
    rest = decoder.decode({slot: good[:, 4:]}, final=frozenset({slot}))[slot]
    torch.testing.assert_close(torch.cat([first, rest]), codec.decode(good[None])[0], **TOLERANCE)
    with pytest.raises(CodecError, match="float32 only"):
        codec.streaming_decoder(max_streams=1, compute_dtype=torch.bfloat16)
