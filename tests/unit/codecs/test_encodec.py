import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import EncodecConfig

from cadenza.codecs import CodecError, load_codec
from cadenza.codecs.encodec import bandwidth_for_codebooks, build_random_encodec, default_bandwidth
from tests.support.legacy_weight_norm import resave_with_legacy_weight_norm_names


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


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A 24 kHz EnCodec saved by ``transformers`` (weight norm under today's names), its norms
    moved off the init's (which equal the weights' own, so a norm left unloaded would not
    show), and its decode of a few frames."""
    model = build_random_encodec(seed=4)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith("original0"):
                parameter.mul_(torch.rand_like(parameter) + 0.5)
    directory = tmp_path_factory.mktemp("encodec")
    model.save_pretrained(str(directory))
    codes = torch.randint(0, 1024, (1, 8, 6), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        audio = model.decode(codes[None], [None])[0][:, 0]
    return directory, codes, audio


LEGACY_NAMED = {
    "none": lambda name: False,
    "every layer's": lambda name: True,
    "the encoder's": lambda name: name.startswith("encoder."),
}


@pytest.mark.parametrize("legacy", LEGACY_NAMED)
def test_a_directory_loads_with_weight_norm_under_either_or_both_names(saved, tmp_path, legacy):
    """facebook/encodec_24khz stores ``weight_g`` / ``weight_v``: ``transformers``' loader maps
    them (checked here, not assumed), a mixture of both styles too."""
    directory, codes, expected = saved
    shutil.copytree(directory, tmp_path, dirs_exist_ok=True)
    resave_with_legacy_weight_norm_names(tmp_path / "model.safetensors", LEGACY_NAMED[legacy])
    names = load_file(tmp_path / "model.safetensors")
    assert any(name.endswith(".weight_g") for name in names) == (legacy != "none")
    assert any(".parametrizations." in name for name in names) == (legacy != "every layer's")
    torch.testing.assert_close(load_codec(str(tmp_path)).decode(codes), expected)


def test_a_directory_with_weights_missing_is_refused(saved, tmp_path):
    shutil.copytree(saved[0], tmp_path, dirs_exist_ok=True)
    resave_with_legacy_weight_norm_names(tmp_path / "model.safetensors")
    tensors = load_file(tmp_path / "model.safetensors")
    del tensors["decoder.layers.0.conv.weight_g"]
    save_file(tensors, tmp_path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(CodecError, match=r"missing \['decoder\.layers\.0\.conv\.param"):
        load_codec(str(tmp_path))


def test_the_default_bandwidth_comes_from_the_config():
    """A config's only bandwidth (the 32 kHz model: 2.2 kbps, 4 codebooks), else 6 kbps where
    offered (24 kHz: 8 codebooks); the bandwidth for a codebook count is one it offers."""
    assert default_bandwidth(EncodecConfig()) == 6.0
    musicgen = EncodecConfig(
        sampling_rate=32000, upsampling_ratios=[8, 5, 4, 4], codebook_size=2048
    )
    musicgen.target_bandwidths = [2.2]
    assert default_bandwidth(musicgen) == 2.2
    assert bandwidth_for_codebooks(musicgen, 4) == 2.2
    assert bandwidth_for_codebooks(EncodecConfig(), 32) == 24.0
    with pytest.raises(CodecError, match="3 codebooks"):
        bandwidth_for_codebooks(musicgen, 3)
    with pytest.raises(CodecError, match="no default"):
        default_bandwidth(EncodecConfig(target_bandwidths=[1.5, 3.0]))
