"""Dia checkpoints as the hub has them: both spellings of ``config.json``, the codec named by a
hub id in the local hub cache (or by a directory, in either file that names it), the codec's
weight norm in any form, and clear errors for what is not a Dia checkpoint."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from huggingface_hub import constants

from cadenza.contract.sampling import SamplingParams
from cadenza.engine.engine import Engine
from cadenza.engine.models.registry import (
    CheckpointError,
    family_of,
    paged_backbone_config,
    stream_state_bytes,
)
from cadenza.engine.offline import synthesize
from tests.support.dia_checkpoints import (
    DAC_HUB_ID,
    reference_dia_generate,
    tiny_dia_checkpoint,
)
from tests.support.float32_compute import float32_cpu_config

TEXT = "[S1] Hello there."
FRAMES = 12
GREEDY = SamplingParams(temperature=0.0, top_k=50)


@pytest.fixture
def hub_cache(tmp_path, monkeypatch) -> Path:
    cache = tmp_path / "hub"
    cache.mkdir()
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    return cache


def speak(directory: Path) -> np.ndarray:
    engine = Engine.from_pretrained(str(directory), dtype="float32", cpu=float32_cpu_config())
    audio = synthesize(
        engine, TEXT, max_duration_s=(FRAMES + 0.5) / engine.frame_rate, sampling=GREEDY
    )
    engine.check_integrity()
    return audio


def test_the_hub_layout_with_its_codec_in_the_hub_cache_speaks_as_transformers(
    tmp_path, hub_cache
) -> None:
    directory = tiny_dia_checkpoint(tmp_path / "dia", legacy_names=True, hub_cache=hub_cache)
    reference = json.loads((directory / "audio_tokenizer_config.json").read_text())
    assert reference["audio_tokenizer_name_or_path"] == DAC_HUB_ID
    [(_, expected)] = reference_dia_generate(
        directory, [TEXT], guidance_scale=3.0, max_new_tokens=FRAMES + 16, hub_cache=hub_cache
    )
    np.testing.assert_allclose(speak(directory), expected, atol=2e-5)


@pytest.mark.parametrize("weight_norm", ["legacy", "parametrizations"])
def test_a_codec_saved_with_its_weight_norm_speaks_as_the_folded_one(tmp_path, weight_norm) -> None:
    folded = tiny_dia_checkpoint(tmp_path / "folded")
    normed = tiny_dia_checkpoint(tmp_path / "normed", codec_weight_norm=weight_norm)
    np.testing.assert_allclose(speak(normed), speak(folded), atol=1e-5)


def test_a_codec_named_in_processor_config_json_is_found(tmp_path) -> None:
    directory = tiny_dia_checkpoint(tmp_path / "dia")
    named = directory / "audio_tokenizer_config.json"
    entry = json.loads(named.read_text())
    named.unlink()
    (directory / "processor_config.json").write_text(json.dumps({"audio_tokenizer": entry}))
    engine = Engine.from_pretrained(str(directory))
    assert engine.model.codec_name == entry["audio_tokenizer_name_or_path"]
    assert engine.sample_rate == 44100


def test_plan_prices_both_branches_paged_and_the_cross_attention_per_stream(tmp_path) -> None:
    directory = tiny_dia_checkpoint(tmp_path / "dia")
    config = json.loads((directory / "config.json").read_text())
    decoder = config["decoder_config"]
    shape = paged_backbone_config(str(directory))
    assert shape.num_layers == 2 * decoder["num_hidden_layers"]
    assert shape.num_kv_heads == decoder["num_key_value_heads"]
    cross = decoder["cross_num_key_value_heads"] * decoder["cross_head_dim"] * 2  # fp16
    longest = config["encoder_config"]["max_position_embeddings"]
    expected = 2 * decoder["num_hidden_layers"] * longest * 2 * cross
    assert stream_state_bytes(str(directory), torch.float16) == expected
    assert family_of(directory).name == "dia"


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda c: c.pop("decoder_config"), "invalid Dia config"),
        (lambda c: c["encoder_config"].update(hidden_size="wide"), "invalid Dia config"),
        (lambda c: c.update(delay_pattern=[0, 1]), "one delay per channel"),
        (lambda c: c["decoder_config"].update(vocab_size=1000), "vocabulary"),
    ],
)
def test_a_broken_config_is_refused_with_the_reason(tmp_path, edit, message) -> None:
    directory = tiny_dia_checkpoint(tmp_path / "dia")
    path = directory / "config.json"
    config = json.loads(path.read_text())
    edit(config)
    path.write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=message):
        Engine.from_pretrained(str(directory))


def test_weights_that_do_not_fit_the_config_are_refused(tmp_path) -> None:
    directory = tiny_dia_checkpoint(tmp_path / "dia")
    path = directory / "config.json"
    config = json.loads(path.read_text())
    config["decoder_config"]["num_hidden_layers"] = 3
    path.write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="weights do not fit"):
        Engine.from_pretrained(str(directory))


def test_a_budget_too_small_for_every_streams_state_runs_fewer_streams(tmp_path) -> None:
    directory = tiny_dia_checkpoint(tmp_path / "dia")
    probe = Engine.from_pretrained(str(directory))
    per_stream = probe.model.state_bytes_per_stream
    budget = 8 * per_stream  # half of it holds four streams' state
    engine = Engine.from_pretrained(str(directory), kv_cache_memory_bytes=budget, max_num_seqs=16)
    assert engine.scheduler.max_num_seqs == engine.info.max_num_seqs == 4
    assert engine.kv_cache.nbytes <= budget - 4 * per_stream
    with pytest.raises(ValueError, match="more than 50% of the KV budget"):
        Engine.from_pretrained(str(directory), kv_cache_memory_bytes=per_stream)
