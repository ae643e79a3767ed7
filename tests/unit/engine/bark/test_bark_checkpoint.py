"""Loading a Bark checkpoint: what it reads, and what it refuses with a message naming why."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from cadenza.codecs.codec import CodecError
from cadenza.codecs.registry import load_codec
from cadenza.engine.models.bark.bark_checkpoint import load_bark
from cadenza.engine.models.checkpoint import CheckpointError
from cadenza.engine.models.registry import family_of, load_checkpoint
from tests.unit.engine.bark.bark_checkpoints import SHORT_VOICE, VOICE, build_tiny_bark


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("bark")
    build_tiny_bark(directory)
    return directory


def _copy(saved: Path, tmp_path: Path) -> Path:
    target = tmp_path / "bark"
    shutil.copytree(saved, target)
    return target


def test_a_checkpoint_loads_with_its_voices_tokenizer_and_codec(saved: Path) -> None:
    bark = load_bark(saved, torch.device("cpu"), torch.float32)
    assert sorted(bark.voices) == sorted([VOICE, SHORT_VOICE])
    assert bark.voices[VOICE].fine.shape == (8, 450)
    assert bark.text_ids("hello world") == [104, 105]  # after BERT's 100 reserved and 4 special
    assert bark.constants.text_pad_token == 129_595
    codec = load_codec(str(saved))  # the EnCodec inside, as the model names it
    assert codec.num_codebooks == 8 and codec.sample_rate == 24_000


def test_the_registry_loads_bark_as_one_more_family(saved: Path) -> None:
    assert family_of(saved).name == "bark"
    model = load_checkpoint(saved, torch.device("cpu"), torch.float32)
    assert model.family == "bark" and model.codec_name == str(saved)
    assert model.voices == ("default", SHORT_VOICE, VOICE)
    assert model.sampling_fields == frozenset({"fine_temperature"}) and model.segments_text


def test_missing_sections_weights_and_tokenizer_are_named(saved: Path, tmp_path: Path) -> None:
    directory = _copy(saved, tmp_path)
    config = json.loads((directory / "config.json").read_text())
    del config["fine_acoustics_config"]
    (directory / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="lacks fine_acoustics_config"):
        load_bark(directory, torch.device("cpu"), torch.float32)
    shutil.copy(saved / "config.json", directory / "config.json")
    (weights,) = directory.glob("*.safetensors")
    tensors = load_file(weights)
    save_file(
        {k: v for k, v in tensors.items() if not k.startswith("coarse_acoustics.layers.1")}, weights
    )
    with pytest.raises(CheckpointError, match=r"coarse: weights missing: layers\.1"):
        load_bark(directory, torch.device("cpu"), torch.float32)
    weights.unlink()
    with pytest.raises(CheckpointError, match=r"no \*\.safetensors"):
        load_bark(directory, torch.device("cpu"), torch.float32)


def test_a_codec_weight_named_both_ways_is_refused(saved: Path, tmp_path: Path) -> None:
    directory = _copy(saved, tmp_path)
    (weights,) = directory.glob("*.safetensors")
    tensors = load_file(weights)
    name = "codec_model.encoder.layers.0.conv.parametrizations.weight.original0"
    tensors["codec_model.encoder.layers.0.conv.weight_g"] = tensors[name].clone()
    save_file(tensors, weights)
    with pytest.raises(CodecError, match=r"weight norm named both ways"):
        load_codec(str(directory))


def test_garbage_generation_config_is_named(saved: Path, tmp_path: Path) -> None:
    directory = _copy(saved, tmp_path)
    (directory / "generation_config.json").write_text(
        json.dumps({"coarse_acoustics_config": {"sliding_window_len": "sixty"}})
    )
    with pytest.raises(CheckpointError, match="sliding_window_len"):
        load_bark(directory, torch.device("cpu"), torch.float32)
    (directory / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(CheckpointError, match="not a Bark checkpoint"):
        load_bark(directory, torch.device("cpu"), torch.float32)
