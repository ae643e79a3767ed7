"""DAC against ``transformers``' ``DacModel``: offline decoding and encoding, and loading.

The checkpoint is a small random DAC (:mod:`tests.support.dac_checkpoints`) saved as
descript/dac_44khz is, weight norm under the legacy names; the reference is the
weight-normalised model in memory.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from huggingface_hub import constants
from safetensors.torch import load_file, save_file
from transformers import DacModel

from cadenza.codecs import CodecError, load_codec
from cadenza.codecs.dac import DacCodec, is_dac_directory, load_dac
from cadenza.codecs.weight_norm import fold_weight_norm
from tests.support.dac_checkpoints import (
    SMALL_HOP,
    random_dac,
    save_legacy_checkpoint,
    small_dac_config,
)
from tests.support.legacy_weight_norm import resave_with_legacy_weight_norm_names


@pytest.fixture(scope="module")
def reference() -> DacModel:
    return random_dac(small_dac_config(), seed=3)


@pytest.fixture(scope="module")
def checkpoints(reference, tmp_path_factory) -> dict[str, Path]:
    """The reference saved with weight norm under the legacy names, today's, and folded."""
    legacy = save_legacy_checkpoint(reference, tmp_path_factory.mktemp("dac_legacy"))
    current = tmp_path_factory.mktemp("dac_current")
    reference.save_pretrained(current)
    plain = tmp_path_factory.mktemp("dac_plain")
    folded = random_dac(small_dac_config(), seed=3)  # a deep copy would share its class
    fold_weight_norm(folded)
    folded.save_pretrained(plain)
    return {"legacy": legacy, "current": current, "plain": plain}


@pytest.fixture(scope="module")
def codec(checkpoints) -> DacCodec:
    loaded = load_codec(str(checkpoints["legacy"]))
    assert isinstance(loaded, DacCodec)
    return loaded


def _codes(frames: int, seed: int, batch: int = 1) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, 64, (batch, 4, frames), generator=generator)


def test_attributes_follow_the_config(codec) -> None:
    assert (codec.sample_rate, codec.hop_length) == (44100, SMALL_HOP)
    assert codec.frame_rate == 44100 / SMALL_HOP
    assert (codec.num_codebooks, codec.codebook_size) == (4, 64)
    assert codec.lookahead_frames == 12  # 177 samples
    assert codec.streaming_dtypes == (torch.float32,)


def test_offline_decode_equals_dac_model(reference, codec) -> None:
    codes = _codes(30, seed=1, batch=2)
    with torch.no_grad():
        expected = reference.decode(audio_codes=codes).audio_values
    got = codec.decode(codes)
    assert got.shape == (2, 30 * SMALL_HOP) and got.dtype == torch.float32
    assert expected.std() > 0.1  # audio, not near-silence
    torch.testing.assert_close(got, expected, atol=1e-6, rtol=1e-5)
    assert codec.decode(codes[..., :0]).shape == (2, 0)


def test_encode_equals_dac_model_on_audio_padded_to_whole_frames(reference, codec) -> None:
    audio = torch.randn(2, 100, generator=torch.Generator().manual_seed(0))
    padded = torch.nn.functional.pad(audio, (0, 7 * SMALL_HOP - 100))
    with torch.no_grad():
        expected = reference.encode(padded[:, None]).audio_codes
    codes = codec.encode(audio)
    assert codes.shape == (2, 4, 7)
    assert torch.equal(codes, expected)
    assert torch.equal(codec.encode_audio(audio[0].numpy()), expected[0])
    for bad in (np.zeros(0, np.float32), np.zeros((2, 5), np.float32)):
        with pytest.raises(CodecError, match="non-empty mono"):
            codec.encode_audio(bad)


@pytest.mark.parametrize(
    ("codes", "message"),
    [
        (torch.zeros(1, 3, 5, dtype=torch.long), r"must be \[batch, 4, frames\]"),
        (torch.zeros(4, 5, dtype=torch.long), r"must be \[batch, 4, frames\]"),
        (torch.full((1, 4, 5), 64), r"must lie in \[0, 64\)"),
        (torch.full((1, 4, 5), -1), r"must lie in \[0, 64\)"),
        (torch.zeros(1, 4, 5), "must be integers"),
    ],
)
def test_bad_codes_are_refused(codec, codes, message) -> None:
    with pytest.raises(CodecError, match=message):
        codec.decode(codes)


@pytest.mark.parametrize("names", ["current", "plain"])
def test_todays_weight_norm_names_and_folded_weights_load_the_same(
    checkpoints, codec, names
) -> None:
    codes = _codes(6, seed=2)
    torch.testing.assert_close(load_dac(str(checkpoints[names])).decode(codes), codec.decode(codes))


def test_a_mixture_of_both_weight_norm_names_loads_the_same(checkpoints, codec, tmp_path) -> None:
    shutil.copytree(checkpoints["current"], tmp_path, dirs_exist_ok=True)
    weights = tmp_path / "model.safetensors"
    assert resave_with_legacy_weight_norm_names(weights, lambda name: name.startswith("decoder."))
    assert any(name.endswith("original0") for name in load_file(weights))  # the encoder's
    codes = _codes(6, seed=3)
    torch.testing.assert_close(load_dac(str(tmp_path)).decode(codes), codec.decode(codes))


def test_load_codec_finds_a_dac_checkpoint_in_the_hub_cache(
    checkpoints, codec, tmp_path, monkeypatch
) -> None:
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    repo = tmp_path / "models--descript--dac_44khz"
    shutil.copytree(checkpoints["legacy"], repo / "snapshots" / ("a" * 40))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("a" * 40)
    loaded = load_codec("descript/dac_44khz")
    assert isinstance(loaded, DacCodec)
    codes = _codes(5, seed=5)
    torch.testing.assert_close(loaded.decode(codes), codec.decode(codes))


def _copy(source: Path, target: Path, **config_changes: object) -> Path:
    shutil.copytree(source, target, dirs_exist_ok=True)
    config = {**json.loads((source / "config.json").read_text()), **config_changes}
    (target / "config.json").write_text(json.dumps(config))
    return target


def test_bad_checkpoints_are_refused(checkpoints, tmp_path) -> None:
    legacy = checkpoints["legacy"]
    assert is_dac_directory(legacy) and not is_dac_directory(tmp_path)

    both = _copy(legacy, tmp_path / "both")
    state = load_file(both / "model.safetensors")
    state["decoder.conv1.parametrizations.weight.original1"] = state["decoder.conv1.weight_v"] + 0
    save_file(state, both / "model.safetensors")
    with pytest.raises(CodecError, match="weight norm named both ways"):
        load_dac(str(both))

    missing = _copy(legacy, tmp_path / "missing")
    state = load_file(missing / "model.safetensors")
    del state["decoder.conv2.bias"]
    save_file(state, missing / "model.safetensors")
    with pytest.raises(CodecError, match="do not fit its config"):
        load_dac(str(missing))
    (missing / "model.safetensors").unlink()
    with pytest.raises(CodecError, match=r"no model\.safetensors"):
        load_dac(str(missing))

    odd = tmp_path / "odd"  # descript/dac_24khz's ratio 5, say
    DacModel(small_dac_config(downsampling_ratios=[2, 5])).save_pretrained(odd)
    with pytest.raises(CodecError, match="odd upsampling ratio"):
        load_dac(str(odd))

    garbled = _copy(legacy, tmp_path / "garbled", n_codebooks="four")
    with pytest.raises(CodecError, match="not a valid DAC config"):
        load_codec(str(garbled))
