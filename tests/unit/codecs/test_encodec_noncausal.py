"""The non-causal EnCodec (MusicGen's 32 kHz model, here with tiny channels): offline decode
equals ``transformers``' (and the audio MusicGen's ``generate`` returns), streaming equals
offline for any chunking of streams joining and leaving a batch, and the look-ahead is the
decoder's receptive field."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from transformers import EncodecConfig, EncodecModel, MusicgenForConditionalGeneration

from cadenza.codecs import CodecError, load_codec
from cadenza.codecs.encodec import EncodecCodec
from cadenza.codecs.encodec_noncausal import lookahead_samples
from cadenza.codecs.encodec_streaming import EncodecStreamingDecoder
from cadenza.codecs.weight_norm import fold_weight_norm
from cadenza.kernels.cpu_lstm import NativeLstm
from tests.support.musicgen_checkpoints import (
    CODEBOOK_SIZE,
    HOP_LENGTH,
    NUM_CODEBOOKS,
    frames_for,
    max_new_tokens_for,
    reference_musicgen_generate,
    tiny_musicgen_checkpoint,
)

TOLERANCE = 2e-5  # absolute, on audio of peak ~0.4
LOOKAHEAD_SAMPLES = 2402  # 3 frames (first conv) + the upsampling layers' centring


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_musicgen_checkpoint(tmp_path_factory.mktemp("musicgen"), seed=0)


@pytest.fixture(scope="module")
def codec(checkpoint: Path) -> Any:
    return load_codec(str(checkpoint))


@pytest.fixture(scope="module")
def reference(checkpoint: Path) -> Any:
    """``transformers``' own EnCodec of the checkpoint (weight norm not folded)."""
    return MusicgenForConditionalGeneration.from_pretrained(checkpoint).audio_encoder.eval()


def _codes(frames: int, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, CODEBOOK_SIZE, (NUM_CODEBOOKS, frames), generator=generator)


def _assert_matches(got: torch.Tensor, expected: torch.Tensor) -> None:
    assert got.shape == expected.shape
    if expected.numel():
        assert (got - expected).abs().max() < TOLERANCE


def _stream(decoder: EncodecStreamingDecoder, codes: torch.Tensor, sizes: list[int]) -> Any:
    """One stream's audio, its codes sent in chunks of ``sizes`` frames, then closed."""
    slot = decoder.open()
    pieces, done = [], 0
    for size in sizes:
        pieces.append(decoder.decode({slot: codes[:, done : done + size]})[slot])
        done += size
    tail = decoder.close(slot)
    return torch.cat([*pieces, *([] if tail is None else [tail])])


@pytest.mark.parametrize("frames", [1, 2, 3, 4, 5, 37])
def test_offline_decode_equals_transformers(codec, reference, frames) -> None:
    codes = _codes(frames, seed=frames)
    with torch.no_grad():
        expected = reference.decode(codes[None, None], [None])[0][0, 0]
    got = codec.decode(codes[None])[0]
    assert got.shape == (frames * HOP_LENGTH,)
    _assert_matches(got, expected)


def test_decodes_what_musicgen_generates_to_its_audio(codec, checkpoint) -> None:
    """The codes ``generate`` hands its EnCodec decode, offline and streamed, to its audio."""
    frames = 12
    generated = reference_musicgen_generate(
        checkpoint,
        ["calm piano", "fast techno with heavy drums"],
        guidance_scale=3.0,
        max_new_tokens=max_new_tokens_for(frames),
    )
    decoder = EncodecStreamingDecoder(codec, max_streams=1)
    for codes, audio in generated:
        assert codes.shape == (NUM_CODEBOOKS, frames_for(max_new_tokens_for(frames)))
        expected = torch.from_numpy(audio)
        _assert_matches(codec.decode(codes[None])[0], expected)
        _assert_matches(_stream(decoder, codes, [5, 1, 6]), expected)


def test_lookahead_is_the_receptive_field(codec) -> None:
    """Sample ``n`` depends on the frames up to ``(n + 2402) // 640``: a change to frame ``f``
    first shows at sample ``640 f - 2402``."""
    assert lookahead_samples(codec.model) == LOOKAHEAD_SAMPLES
    assert codec.lookahead_frames == 4  # frame j's last sample needs frame j + 4
    assert EncodecStreamingDecoder(codec, 1).lookahead_samples == LOOKAHEAD_SAMPLES
    codes = _codes(20, seed=7)
    base = codec.decode(codes[None])[0]
    for frame in (5, 12):
        changed = codes.clone()
        changed[:, frame] = (changed[:, frame] + 1) % CODEBOOK_SIZE
        differs = (codec.decode(changed[None])[0] != base).nonzero()
        assert differs[0].item() == frame * HOP_LENGTH - LOOKAHEAD_SAMPLES


def test_each_chunk_releases_all_but_the_lookahead(codec) -> None:
    decoder = EncodecStreamingDecoder(codec, max_streams=1)
    slot = decoder.open()
    codes = _codes(10, seed=8)
    sent = 0
    for frame in range(10):
        sent += decoder.decode({slot: codes[:, frame : frame + 1]})[slot].numel()
        # buffered until the first conv has its 3 frames of left padding and one more
        expected = 0 if frame < 3 else (frame + 1) * HOP_LENGTH - LOOKAHEAD_SAMPLES
        assert sent == expected
    tail = decoder.close(slot)
    assert tail is not None and tail.numel() == LOOKAHEAD_SAMPLES


stream_plans = st.lists(
    st.tuples(
        st.integers(0, 3),  # the tick the stream opens at
        # its chunk sizes (0: no frames), few distinct ones: each new shape costs oneDNN a plan
        st.lists(st.sampled_from([0, 1, 3, 6]), min_size=1, max_size=5),
        st.booleans(),  # end with a final chunk (True) or with close() (False)
    ),
    min_size=1,
    max_size=3,
)


@settings(
    max_examples=10,
    deadline=None,
    phases=[Phase.explicit, Phase.reuse, Phase.generate],
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(plans=stream_plans)
def test_random_chunkings_of_streams_joining_and_leaving(codec, plans) -> None:
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
        got = torch.cat(pieces[n]) if pieces[n] else torch.zeros(0)
        _assert_matches(got, codec.decode(stream_codes[None])[0])


@pytest.mark.parametrize("native", [True, False])
def test_ragged_batches_match_offline_on_either_lstm(codec, monkeypatch, native) -> None:
    if not native:
        monkeypatch.setattr(NativeLstm, "build", classmethod(lambda cls, lstm, dtype: None))
    decoder = EncodecStreamingDecoder(codec, max_streams=3)
    plans = [[9, 6, 7], [3, 12, 1], [1, 2, 8]]
    codes = [_codes(sum(plan), seed) for seed, plan in enumerate(plans)]
    slots = [decoder.open() for _ in plans]
    pieces: list[list[torch.Tensor]] = [[] for _ in plans]
    for tick in range(3):
        chunks = {}
        for n, plan in enumerate(plans):
            done = sum(plan[:tick])
            chunks[slots[n]] = codes[n][:, done : done + plan[tick]]
        out = decoder.decode(chunks, final=frozenset(slots) if tick == 2 else frozenset())
        for n, slot in enumerate(slots):
            pieces[n].append(out[slot])
    for n in range(len(plans)):
        _assert_matches(torch.cat(pieces[n]), codec.decode(codes[n][None])[0])


@pytest.mark.parametrize("frames", [0, 1, 2, 3])
def test_streams_shorter_than_the_first_padding_are_decoded_at_close(codec, frames) -> None:
    """Offline, an input no longer than a conv's padding is zero-extended before it is
    reflected: a stream that short is held back whole and padded that way at its end."""
    decoder = EncodecStreamingDecoder(codec, max_streams=1)
    codes = _codes(frames, seed=frames)
    slot = decoder.open()
    assert decoder.decode({slot: codes})[slot].numel() == 0
    tail = decoder.close(slot)
    if frames == 0:
        assert tail is None
    else:
        assert tail is not None
        _assert_matches(tail, codec.decode(codes[None])[0])


@pytest.mark.parametrize("frames", [1, 3, 4, 11])
def test_a_whole_stream_in_one_final_chunk(codec, frames) -> None:
    """Every conv pads such a stream at both ends in one pass, as offline."""
    decoder = EncodecStreamingDecoder(codec, max_streams=2)
    codes = _codes(frames, seed=frames)
    other, slot = decoder.open(), decoder.open()
    decoder.decode({other: _codes(6, seed=0)})  # another stream, mid-way, in the same batch
    out = decoder.decode({slot: codes, other: codes[:, :0]}, final=frozenset({slot}))
    _assert_matches(out[slot], codec.decode(codes[None])[0])
    assert slot not in decoder.open_slots and other in decoder.open_slots


def test_a_slot_is_reusable_after_close(codec) -> None:
    decoder = EncodecStreamingDecoder(codec, max_streams=1)
    for seed in (1, 2):
        codes = _codes(15, seed)
        _assert_matches(_stream(decoder, codes, [2, 9, 4]), codec.decode(codes[None])[0])


def test_bf16_streaming_is_within_bf16_rounding_of_float32(codec) -> None:
    codes = _codes(20, seed=4)
    expected = codec.decode(codes[None])[0]
    got = _stream(EncodecStreamingDecoder(codec, 1, torch.bfloat16), codes, [6, 1, 13])
    assert got.dtype == torch.float32 and got.shape == expected.shape
    snr_db = 10 * torch.log10((expected**2).mean() / ((got - expected) ** 2).mean())
    assert snr_db > 30.0


@pytest.mark.parametrize(
    "codes",
    [
        torch.zeros(1, NUM_CODEBOOKS + 1, 5, dtype=torch.long),  # wrong codebook count
        torch.zeros(NUM_CODEBOOKS, 5, dtype=torch.long),  # missing batch dim
        torch.full((1, NUM_CODEBOOKS, 5), CODEBOOK_SIZE),  # out of range
        torch.full((1, NUM_CODEBOOKS, 5), -1),
        torch.zeros(1, NUM_CODEBOOKS, 5),  # float codes
    ],
)
def test_garbage_codes_are_refused(codec, codes) -> None:
    with pytest.raises(CodecError):
        codec.decode(codes)
    decoder = EncodecStreamingDecoder(codec, max_streams=1)
    slot = decoder.open()
    with pytest.raises(CodecError):
        decoder.decode({slot: codes[0]})


def _random_codec(**changes: Any) -> EncodecCodec:
    """A tiny random EnCodec (codebooks drawn too), weight norm folded."""
    values: dict[str, Any] = {
        "sampling_rate": 8000,
        "upsampling_ratios": [5, 4],
        "target_bandwidths": [4.0],  # 2 codebooks of 5 bits at 400 frames a second
        "codebook_size": 32,
        "num_filters": 4,
        "hidden_size": 8,
        "num_lstm_layers": 1,
        **changes,
    }
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model: Any = EncodecModel(EncodecConfig(**values))
        with torch.no_grad():
            for name, buffer in model.quantizer.named_buffers():
                if name.endswith("codebook.embed"):
                    buffer.copy_(torch.randn(buffer.shape))
    fold_weight_norm(model)
    return EncodecCodec(model.eval(), 4.0)


@pytest.mark.parametrize(
    "changes",
    [
        {"use_causal_conv": False, "pad_mode": "replicate", "use_conv_shortcut": True},
        {"use_causal_conv": False, "pad_mode": "constant", "num_residual_layers": 2},
        {"use_causal_conv": False, "kernel_size": 5, "residual_kernel_size": 5},
        {"use_causal_conv": True, "trim_right_ratio": 0.5},  # trims both ends too
    ],
    ids=["replicate", "constant-dilated", "kernel-5", "causal-trimmed-both-ends"],
)
def test_other_padding_and_trimming_configs_stream_exactly(changes) -> None:
    codec = _random_codec(**changes)
    codes = torch.randint(0, 32, (2, 23), generator=torch.Generator().manual_seed(3))
    expected = codec.decode(codes[None])[0]
    decoder = EncodecStreamingDecoder(codec, max_streams=1)
    for sizes in ([23], [1] * 23, [2, 0, 7, 1, 13]):
        _assert_matches(_stream(decoder, codes, sizes), expected)
    samples = lookahead_samples(codec.model)
    assert codec.lookahead_frames == -(-samples // codec.hop_length)
    if changes["use_causal_conv"]:
        assert samples > 0  # the transposed convs' cut at the start


def test_a_pad_mode_that_reads_the_far_end_is_refused() -> None:
    codec = _random_codec(use_causal_conv=False, pad_mode="circular")
    with pytest.raises(CodecError, match="circular"):
        EncodecStreamingDecoder(codec, max_streams=1)
