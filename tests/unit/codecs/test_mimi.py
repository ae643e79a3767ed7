"""Mimi, offline: decode and encode equal ``transformers``' ``MimiModel``; checkpoints load from
a Mimi directory and from a Sesame CSM one (neither holds weight norm); bad input is refused."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from torch.nn.utils import parametrize
from transformers import CsmConfig, CsmForConditionalGeneration, MimiConfig, MimiModel

from cadenza.codecs import CodecError, load_codec
from cadenza.codecs.mimi import MimiCodec, build_random_mimi, is_mimi_directory, load_mimi

HOP = 1920


def tiny_mimi_config() -> MimiConfig:
    """A small Mimi with the real model's rates (24 kHz, hop 1920, 12.5 Hz -> 25 Hz) and a
    sliding window of 6 positions (3 frames), so a few frames already slide it. Layer scales
    start at 1, not 0.01, so the transformers matter to the audio."""
    return MimiConfig(
        hidden_size=32,
        num_filters=4,
        num_hidden_layers=2,
        intermediate_size=64,
        num_attention_heads=4,
        num_key_value_heads=2,
        sliding_window=6,
        num_quantizers=8,
        codebook_size=64,
        codebook_dim=16,
        vector_quantization_hidden_dimension=16,
        upsample_groups=32,
        layer_scale_initial_scale=1.0,
    )


def tiny_mimi_codec(seed: int = 0, num_codebooks: int | None = None) -> MimiCodec:
    return MimiCodec(build_random_mimi(tiny_mimi_config(), seed), num_codebooks)


def random_codes(frames: int, seed: int, batch: int = 1, codebooks: int = 8) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, 64, (batch, codebooks, frames), generator=generator)


@pytest.fixture(scope="module")
def codec() -> MimiCodec:
    return tiny_mimi_codec()


def test_attributes(codec) -> None:
    assert (codec.sample_rate, codec.hop_length, codec.frame_rate) == (24000, HOP, 12.5)
    assert (codec.num_codebooks, codec.codebook_size, codec.lookahead_frames) == (8, 64, 0)
    assert codec.streaming_dtypes == (torch.float32,)


def test_codebooks_are_random_so_codes_matter(codec) -> None:
    # transformers starts every codebook at zero (all codes would decode alike):
    # build_random_mimi draws them from the seed.
    zeros = codec.decode(torch.zeros(1, 8, 4, dtype=torch.long))
    ones = codec.decode(torch.ones(1, 8, 4, dtype=torch.long))
    assert (zeros - ones).abs().max() > 0.1 * zeros.abs().max()


def test_decode_equals_transformers_and_is_prefix_exact(codec) -> None:
    codes = random_codes(12, seed=1, batch=2)
    got = codec.decode(codes)
    with torch.no_grad():
        expected = codec.model.decode(codes).audio_values
    assert expected.shape == (2, 1, 12 * HOP)  # transformers' own length: exactly T * hop
    assert got.shape == (2, 12 * HOP) and got.dtype == torch.float32
    torch.testing.assert_close(got, expected[:, 0])
    prefix = codec.decode(codes[..., :7])
    scale = got.abs().max()
    assert (prefix - got[:, : 7 * HOP]).abs().max() / scale < 1e-5
    assert codec.decode(codes[..., :0]).shape == (2, 0)


def test_fewer_codebooks_decode_the_first_ones() -> None:
    small = tiny_mimi_codec(num_codebooks=3)
    codes = random_codes(5, seed=2, codebooks=3)
    with torch.no_grad():
        expected = small.model.decode(codes).audio_values[:, 0]
    torch.testing.assert_close(small.decode(codes), expected)
    with pytest.raises(CodecError, match=r"\[batch, 3, frames\]"):
        small.decode(random_codes(5, seed=2))
    for wrong in (0, 9):
        with pytest.raises(CodecError, match="codebooks"):
            tiny_mimi_codec(num_codebooks=wrong)


@pytest.mark.parametrize("samples", [9 * HOP, 9 * HOP + 7, 5 * HOP - 1000, 5])
def test_encode_equals_transformers(codec, samples) -> None:
    audio = 0.3 * torch.randn(2, samples, generator=torch.Generator().manual_seed(samples))
    codes = codec.encode(audio)
    with torch.no_grad():
        expected = codec.model.encode(audio[:, None], num_quantizers=8).audio_codes
    assert codes.shape == (2, 8, math.ceil(samples / HOP))
    assert torch.equal(codes, expected)
    assert codes.min() >= 0 and codes.max() < 64
    mono = codec.encode_audio(audio[0].numpy())
    assert torch.equal(mono, codes[0])


def test_encode_refuses_bad_audio(codec) -> None:
    for bad in (torch.zeros(10), torch.zeros(1, 1, 10), torch.zeros(1, 0)):
        with pytest.raises(CodecError, match="audio"):
            codec.encode(bad)
    with pytest.raises(CodecError, match="non-empty"):
        codec.encode_audio(np.zeros(0, np.float32))
    with pytest.raises(CodecError, match="non-empty"):
        codec.encode_audio(np.zeros((2, 10), np.float32))


@pytest.mark.parametrize(
    "codes",
    [
        torch.zeros(1, 7, 5, dtype=torch.long),  # wrong codebook count
        torch.zeros(8, 5, dtype=torch.long),  # missing batch dim
        torch.full((1, 8, 5), 64),  # out of range
        torch.full((1, 8, 5), -1),
        torch.zeros(1, 8, 5),  # float codes
    ],
)
def test_bad_codes_are_refused(codec, codes) -> None:
    with pytest.raises(CodecError):
        codec.decode(codes)


def test_bf16_streaming_is_refused(codec) -> None:
    with pytest.raises(CodecError, match="float32 only"):
        codec.streaming_decoder(1, torch.bfloat16)


# -- loading --------------------------------------------------------------------------------


def test_loads_a_mimi_directory(codec, tmp_path) -> None:
    codec.model.save_pretrained(tmp_path)
    assert is_mimi_directory(tmp_path)
    codes = random_codes(6, seed=3)
    expected = codec.decode(codes)
    for loaded in (load_mimi(str(tmp_path)), load_codec(str(tmp_path))):
        assert isinstance(loaded, MimiCodec) and loaded.num_codebooks == 8
        torch.testing.assert_close(loaded.decode(codes), expected)
    assert load_mimi(str(tmp_path), num_codebooks=4).num_codebooks == 4


def _tiny_csm(codec: MimiCodec) -> CsmForConditionalGeneration:
    """A tiny CSM whose codec holds ``codec``'s weights (random codebooks included)."""
    depth = {
        "hidden_size": 16,
        "intermediate_size": 32,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "num_codebooks": 8,
        "backbone_hidden_size": 16,
        "vocab_size": 67,
    }
    config = CsmConfig(
        codec_config=tiny_mimi_config().to_dict(),
        depth_decoder_config=depth,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        num_codebooks=8,
        vocab_size=67,
        text_vocab_size=100,
        pad_token_id=1,
        codebook_pad_token_id=66,
        codebook_eos_token_id=0,
        bos_token_id=2,
        audio_token_id=3,
        audio_eos_token_id=4,
    )
    model = CsmForConditionalGeneration(config)
    model.codec_model.load_state_dict(codec.model.state_dict())
    return model.eval()


@pytest.mark.parametrize("sharded", [False, True])
def test_loads_the_codec_of_a_csm_checkpoint(codec, tmp_path, sharded) -> None:
    csm = _tiny_csm(codec)
    csm.save_pretrained(tmp_path, max_shard_size="20KB" if sharded else "5GB")
    assert (tmp_path / "model.safetensors.index.json").exists() == sharded
    assert is_mimi_directory(tmp_path)
    codes = random_codes(6, seed=4)
    with torch.no_grad():
        expected = csm.codec_model.decode(codes).audio_values[:, 0]
    for loaded in (load_mimi(str(tmp_path)), load_codec(str(tmp_path))):
        assert isinstance(loaded, MimiCodec)
        assert loaded.num_codebooks == 8  # the CSM config's num_codebooks
        torch.testing.assert_close(loaded.decode(codes), expected)


@pytest.mark.parametrize("config", [tiny_mimi_config(), MimiConfig()], ids=["tiny", "kyutai"])
def test_mimi_holds_no_weight_norm_so_no_legacy_names_to_map(config) -> None:
    """Unlike EnCodec and SNAC, ``transformers``' Mimi (alone, and as a CSM's codec) has no
    weight-normalised layer, and its conversion script loads Kyutai's weights into it strictly:
    kyutai/mimi and sesame/csm-1b hold no ``weight_g`` / ``weight_v``, and the loaders need no
    renaming (:mod:`cadenza.codecs.weight_norm`). Should a release add weight norm, this fails."""
    with torch.device("meta"):
        model = MimiModel(config)
    assert not any(parametrize.is_parametrized(module) for module in model.modules())
    names = list(model.state_dict())
    assert names and not any(
        ".parametrizations." in name or name.endswith((".weight_g", ".weight_v")) for name in names
    )


def test_refuses_what_is_not_mimi(codec, tmp_path) -> None:
    with pytest.raises(CodecError, match="not a directory"):
        load_mimi(str(tmp_path / "absent"))
    with pytest.raises(CodecError, match=r"no config\.json"):
        load_mimi(str(tmp_path))
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "encodec"}))
    assert not is_mimi_directory(tmp_path)
    with pytest.raises(CodecError, match="not Mimi"):
        load_mimi(str(tmp_path))
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(CodecError, match="JSON"):
        load_mimi(str(tmp_path))
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "mimi"}))
    with pytest.raises(CodecError, match=r"no model\.safetensors"):
        load_mimi(str(tmp_path))


def test_refuses_a_mimi_directory_with_missing_weights(codec, tmp_path) -> None:
    from safetensors.torch import load_file, save_file

    codec.model.save_pretrained(tmp_path)
    state = load_file(tmp_path / "model.safetensors")
    del state["upsample.conv.weight"]
    save_file(state, tmp_path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(CodecError, match="do not fit"):
        load_mimi(str(tmp_path))


def test_refuses_broken_csm_checkpoints(codec, tmp_path) -> None:
    csm_config = {"model_type": "csm", "num_codebooks": 8}
    (tmp_path / "config.json").write_text(json.dumps(csm_config))
    with pytest.raises(CodecError, match="no codec_config"):
        load_mimi(str(tmp_path))
    csm_config["codec_config"] = tiny_mimi_config().to_dict()
    (tmp_path / "config.json").write_text(json.dumps(csm_config))
    with pytest.raises(CodecError, match=r"no model\.safetensors"):
        load_mimi(str(tmp_path))
    from safetensors.torch import save_file

    save_file({"backbone.weight": torch.zeros(2)}, tmp_path / "model.safetensors")
    with pytest.raises(CodecError, match="no codec_model"):
        load_mimi(str(tmp_path))
    state = {"codec_model." + k: v for k, v in codec.model.state_dict().items()}
    state.pop("codec_model.decoder.upsample.conv.weight")
    save_file(state, tmp_path / "model.safetensors")
    with pytest.raises(CodecError, match="do not fit"):
        load_mimi(str(tmp_path))
