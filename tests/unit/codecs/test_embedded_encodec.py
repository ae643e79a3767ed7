"""The EnCodec inside a MusicGen checkpoint loads through the registry, from a directory or the
hub cache, its weight norm under either name, and decodes as ``transformers``' MusicGen does;
what does not fit is refused."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from huggingface_hub import constants
from safetensors.torch import load_file, save_file
from transformers import MusicgenForConditionalGeneration

from cadenza.codecs import CodecError, load_codec
from cadenza.codecs.embedded_encodec import is_embedded_encodec_directory, load_embedded_encodec
from cadenza.codecs.encodec import EncodecCodec
from tests.support.dia_checkpoints import hub_cache_snapshot
from tests.support.musicgen_checkpoints import (
    BANDWIDTH_KBPS,
    CODEBOOK_SIZE,
    FRAME_RATE,
    HOP_LENGTH,
    NUM_CODEBOOKS,
    SAMPLING_RATE,
    tiny_musicgen_checkpoint,
)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The same tiny MusicGen saved with its EnCodec's weight norm under each name."""
    return {
        name: tiny_musicgen_checkpoint(tmp_path_factory.mktemp(name), legacy_weight_norm=legacy)
        for name, legacy in (("legacy", True), ("current", False))
    }


@pytest.fixture(scope="module")
def expected(checkpoints: dict[str, Path]) -> tuple[torch.Tensor, torch.Tensor]:
    """Codes and what ``transformers``' MusicGen's own EnCodec decodes them to."""
    model: Any = MusicgenForConditionalGeneration.from_pretrained(checkpoints["legacy"])
    codes = torch.randint(0, CODEBOOK_SIZE, (1, NUM_CODEBOOKS, 9))
    with torch.no_grad():
        audio = model.audio_encoder.eval().decode(codes[None], [None])[0][:, 0]
    return codes, audio


def _assert_decodes_as_transformers(codec: Any, expected: tuple[torch.Tensor, torch.Tensor]):
    codes, audio = expected
    torch.testing.assert_close(codec.decode(codes), audio, rtol=0, atol=2e-5)


@pytest.mark.parametrize("names", ["legacy", "current"])
def test_the_registry_loads_the_encodec_of_a_musicgen_directory(checkpoints, expected, names):
    weights = load_file(checkpoints[names] / "model.safetensors")
    legacy = any(name.endswith("conv.weight_g") for name in weights)
    assert legacy == (names == "legacy")
    codec = load_codec(str(checkpoints[names]))
    assert isinstance(codec, EncodecCodec)
    assert (codec.sample_rate, codec.frame_rate) == (SAMPLING_RATE, FRAME_RATE)
    assert codec.hop_length == HOP_LENGTH
    assert (codec.num_codebooks, codec.codebook_size) == (NUM_CODEBOOKS, CODEBOOK_SIZE)
    assert codec.bandwidth_kbps == BANDWIDTH_KBPS
    assert codec.lookahead_frames == 4
    _assert_decodes_as_transformers(codec, expected)


def test_a_hub_id_in_the_local_cache_loads_the_same(checkpoints, expected, tmp_path, monkeypatch):
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    hub_cache_snapshot(tmp_path, "facebook/musicgen-small", checkpoints["legacy"])
    _assert_decodes_as_transformers(load_codec("facebook/musicgen-small"), expected)


def test_sharded_weights_load(checkpoints, expected, tmp_path):
    """A sharded checkpoint (musicgen-large's layout): only the index's audio_encoder shards
    are read."""
    tensors = load_file(checkpoints["legacy"] / "model.safetensors")
    names = sorted(tensors)
    shards = {"model-00001-of-00002.safetensors": names[::2]}
    shards["model-00002-of-00002.safetensors"] = names[1::2]
    for file, shard_names in shards.items():
        save_file({n: tensors[n] for n in shard_names}, tmp_path / file, metadata={"format": "pt"})
    weight_map = {name: file for file, shard_names in shards.items() for name in shard_names}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    shutil.copy(checkpoints["legacy"] / "config.json", tmp_path)
    _assert_decodes_as_transformers(load_codec(str(tmp_path)), expected)


def test_recognition(tmp_path):
    def directory(name: str, config: object) -> Path:
        path = tmp_path / name
        path.mkdir()
        (path / "config.json").write_text(json.dumps(config))
        return path

    encodec = {"model_type": "encodec"}
    musicgen = directory("musicgen", {"model_type": "musicgen", "audio_encoder": encodec})
    assert is_embedded_encodec_directory(musicgen)
    melody = directory("melody", {"model_type": "musicgen_melody", "audio_encoder": encodec})
    assert is_embedded_encodec_directory(melody)
    assert not is_embedded_encodec_directory(directory("encodec", encodec))
    assert not is_embedded_encodec_directory(directory("list", [encodec]))
    dac = {"model_type": "x", "audio_encoder": {"model_type": "dac"}}
    assert not is_embedded_encodec_directory(directory("dac", dac))
    assert not is_embedded_encodec_directory(tmp_path / "nowhere")


def _copy(source: Path, target: Path, **config_changes: Any) -> Path:
    shutil.copytree(source, target, dirs_exist_ok=True)
    config = {**json.loads((source / "config.json").read_text()), **config_changes}
    (target / "config.json").write_text(json.dumps(config))
    return target


def test_a_missing_weight_is_refused(checkpoints, tmp_path):
    directory = _copy(checkpoints["legacy"], tmp_path)
    tensors = load_file(directory / "model.safetensors")
    del tensors["audio_encoder.decoder.layers.0.conv.weight_g"]
    save_file(tensors, directory / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(CodecError, match="do not fit"):
        load_codec(str(directory))


def test_weight_norm_named_both_ways_is_refused(checkpoints, tmp_path):
    directory = _copy(checkpoints["legacy"], tmp_path)
    tensors = load_file(directory / "model.safetensors")
    name = "audio_encoder.decoder.layers.0.conv.weight_g"
    tensors[name.replace("weight_g", "parametrizations.weight.original0")] = tensors[name].clone()
    save_file(tensors, directory / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(CodecError, match="named both ways"):
        load_codec(str(directory))


def test_a_codebook_count_the_encodec_does_not_offer_is_refused(checkpoints, tmp_path):
    config = json.loads((checkpoints["legacy"] / "config.json").read_text())
    decoder = {**config["decoder"], "num_codebooks": 3}
    directory = _copy(checkpoints["legacy"], tmp_path, decoder=decoder)
    with pytest.raises(CodecError, match="3 codebooks"):
        load_codec(str(directory))


def test_a_stereo_decoder_uses_its_codebooks_per_channel(checkpoints, tmp_path):
    config = json.loads((checkpoints["legacy"] / "config.json").read_text())
    decoder = {**config["decoder"], "num_codebooks": 2 * NUM_CODEBOOKS, "audio_channels": 2}
    codec = load_codec(str(_copy(checkpoints["legacy"], tmp_path, decoder=decoder)))
    assert codec.num_codebooks == NUM_CODEBOOKS


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ("no weights", "no model.safetensors"),
        ("no config", "no config.json"),
        ("not an EnCodec", "no EnCodec audio_encoder"),
        ("bad config", "no valid EnCodec config"),
    ],
)
def test_what_is_not_an_embedded_encodec_is_refused(checkpoints, tmp_path, change, message):
    directory = _copy(checkpoints["legacy"], tmp_path)
    config = json.loads((directory / "config.json").read_text())
    if change == "no weights":
        (directory / "model.safetensors").unlink()
    elif change == "no config":
        (directory / "config.json").unlink()
    elif change == "not an EnCodec":
        config["audio_encoder"]["model_type"] = "dac"
    else:
        config["audio_encoder"]["upsampling_ratios"] = "eight"
    if change in ("not an EnCodec", "bad config"):
        (directory / "config.json").write_text(json.dumps(config))
    with pytest.raises(CodecError, match=message):
        load_embedded_encodec(str(directory))
