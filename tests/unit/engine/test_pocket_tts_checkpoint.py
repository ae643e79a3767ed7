"""Pocket TTS checkpoints as published: recognised by the registry, their config read into
the model's shape and generation constants (``cadenza plan`` reads the paged KV from the config
alone), the audio tokenizer found where the processor names it (a directory or a hub id in the
local hub cache), and every malformed file refused with the reason."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from cadenza.engine.models import registry
from cadenza.engine.models.checkpoint import CheckpointError
from cadenza.engine.models.pocket_tts_checkpoint import pocket_tts_spec
from tests.support.pocket_tts_checkpoints import (
    AUDIO_TOKENIZER_HUB_ID,
    write_pocket_tts_checkpoint,
)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    return write_pocket_tts_checkpoint(tmp_path_factory.mktemp("pocket") / "pocket-tiny")


def _config(directory: Path) -> dict:
    return json.loads((directory / "config.json").read_text())


def test_the_registry_recognises_it_and_reads_its_shape_from_the_config(checkpoint) -> None:
    assert registry.family_of(checkpoint).name == "pocket_tts"
    spec = pocket_tts_spec(checkpoint, _config(checkpoint))
    assert (spec.backbone.hidden_size, spec.backbone.num_layers, spec.latent_dim) == (64, 2, 8)
    assert (spec.audio_prompt_id, spec.audio_latent_id, spec.audio_bos_id) == (4000, 4001, 4003)
    assert (spec.num_flow_steps, spec.eos_threshold, spec.min_frames_before_eos) == (1, -4.0, 6)
    assert spec.sampling.temperature == 0.7 and spec.sampling.top_k == 0
    assert spec.max_frames([5, 6, 7, 4003]) == 38  # ceil((3 / 3 + 2) * 12.5)
    shape = registry.paged_backbone_config(str(checkpoint))
    assert (shape.num_layers, shape.num_kv_heads, shape.head_dim) == (2, 4, 16)


def test_the_audio_tokenizer_is_found_in_the_local_hub_cache(tmp_path, monkeypatch) -> None:
    from huggingface_hub import constants

    cache = tmp_path / "hub"
    directory = write_pocket_tts_checkpoint(tmp_path / "pocket", hub_cache=cache)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    model = registry.load_checkpoint(directory, torch.device("cpu"), torch.float32)
    assert model.codec_name == AUDIO_TOKENIZER_HUB_ID
    from cadenza.codecs.registry import load_codec

    codec = load_codec(model.codec_name)
    assert codec.num_codebooks == 8 and codec.frame_rate == 12.5


def _broken(tmp_path: Path, **changes: object) -> Path:
    directory = write_pocket_tts_checkpoint(tmp_path / "pocket", voices=True)
    config = _config(directory)
    for key, value in changes.items():
        if key == "flow_type":
            config["flow_head_config"]["flow_type"] = value
        else:
            config[key] = value
    (directory / "config.json").write_text(json.dumps(config))
    return directory


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"attention_bias": True}, "attention_bias"),
        ({"hidden_act": "relu"}, "hidden_act 'relu'"),
        ({"flow_type": "diffusion"}, "flow_type 'diffusion'"),
        ({"hidden_size": "wide"}, "invalid Pocket TTS config"),
        ({"audio_bos_token_id": 9999}, "audio ids outside the vocabulary"),
        ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4}}, "rope type 'yarn'"),
    ],
)
def test_a_config_it_cannot_serve_is_refused_with_the_reason(tmp_path, changes, message) -> None:
    directory = _broken(tmp_path, **changes)
    with pytest.raises(CheckpointError, match=message):
        registry.load_checkpoint(directory, torch.device("cpu"), torch.float32)


def test_weights_that_do_not_fit_are_refused(tmp_path) -> None:
    directory = _broken(tmp_path, intermediate_size=96)
    with pytest.raises(CheckpointError, match="weights do not fit the config"):
        registry.load_checkpoint(directory, torch.device("cpu"), torch.float32)


def test_a_checkpoint_without_its_processor_files_is_refused(tmp_path) -> None:
    directory = write_pocket_tts_checkpoint(tmp_path / "pocket")
    (directory / "processor_config.json").unlink()
    with pytest.raises(CheckpointError, match="no audio tokenizer named"):
        registry.load_checkpoint(directory, torch.device("cpu"), torch.float32)
