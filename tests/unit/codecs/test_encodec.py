import pytest
import torch

from cadenza.codecs import CodecError, load_codec


@pytest.fixture(scope="module")
def codec():
    return load_codec("encodec_24khz", seed=0)


def test_attributes(codec):
    assert (codec.sample_rate, codec.hop_length, codec.frame_rate) == (24000, 320, 75.0)
    assert (codec.num_codebooks, codec.codebook_size) == (8, 1024)


def test_same_seed_same_codec(codec):
    other = load_codec("encodec_24khz", seed=0)
    codes = torch.randint(0, 1024, (1, 8, 10), generator=torch.Generator().manual_seed(0))
    assert torch.equal(codec.decode(codes), other.decode(codes))


def test_decode_is_causal_prefix_exact(codec):
    codes = torch.randint(0, 1024, (2, 8, 40), generator=torch.Generator().manual_seed(1))
    full = codec.decode(codes)
    prefix = codec.decode(codes[..., :25])
    assert full.shape == (2, 40 * 320)
    torch.testing.assert_close(prefix, full[:, : 25 * 320], rtol=1e-4, atol=1e-5)


def test_encode_gives_codes_in_range(codec):
    audio = torch.sin(torch.linspace(0, 200, 4800))[None]
    codes = codec.encode(audio)
    assert codes.shape == (1, 8, 15)
    assert codes.min() >= 0 and codes.max() < 1024


@pytest.mark.parametrize(
    "codes",
    [
        torch.zeros(1, 7, 5, dtype=torch.long),  # wrong codebook count
        torch.zeros(8, 5, dtype=torch.long),  # missing batch dim
        torch.full((1, 8, 5), 1024),  # out of range
        torch.full((1, 8, 5), -1),
        torch.zeros(1, 8, 5),  # float codes
    ],
)
def test_bad_codes_are_refused(codec, codes):
    with pytest.raises(CodecError):
        codec.decode(codes)


def test_unknown_codec():
    with pytest.raises(CodecError, match="unknown codec"):
        load_codec("nope")


def test_speech_prompt_audio_becomes_prompt_codes(codec):
    import numpy as np

    audio = (0.3 * np.sin(np.arange(24000) / 24000 * 2 * np.pi * 220)).astype(np.float32)
    codes = codec.encode_audio(audio)  # 1 s at the codec's 24 kHz -> 75 frames
    assert codes.shape == (8, 75)
    assert torch.equal(codes, codec.encode(torch.from_numpy(audio)[None])[0])
    with pytest.raises(CodecError, match="non-empty"):
        codec.encode_audio(audio[:0])
    with pytest.raises(CodecError, match="non-empty"):
        codec.encode_audio(np.zeros((2, 10), np.float32))
