"""``cadenza plan --model BARK_DIR``'s arithmetic: each causal stage's KV a stream, from the config
alone; a config without the stages is refused with what is missing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cadenza.engine.models.bark.bark_kv_plan import bark_kv_plan
from cadenza.engine.models.checkpoint import CheckpointError

STAGE = {
    "hidden_size": 32,
    "num_heads": 2,
    "num_layers": 2,
    "block_size": 1024,
    "input_vocab_size": 10,
    "output_vocab_size": 10,
}


def _config(directory: Path, **sections: object) -> Path:
    directory.mkdir(exist_ok=True)
    (directory / "config.json").write_text(json.dumps({"model_type": "bark", **sections}))
    return directory


def test_each_causal_stage_holds_its_block_of_keys_and_values(tmp_path: Path) -> None:
    directory = _config(tmp_path / "b", semantic_config=STAGE, coarse_acoustics_config=STAGE)
    plan = bark_kv_plan(directory, "fp16", memory_bytes=2**30, weights_bytes=2**29)
    per_stage = 2 * 2 * 2 * 16 * 1024 * 2  # K and V, layers, heads, head width, positions, fp16
    assert plan["semantic_kv_bytes_per_stream"] == plan["coarse_kv_bytes_per_stream"] == per_stage
    assert plan["fine_kv_bytes_per_stream"] == 0
    assert plan["streams_that_fit"] == 2**29 // (2 * per_stage)


@pytest.mark.parametrize(
    "sections",
    [
        {},
        {"semantic_config": STAGE},
        {"semantic_config": STAGE, "coarse_acoustics_config": "twelve layers"},
        {"semantic_config": STAGE, "coarse_acoustics_config": {**STAGE, "num_heads": "two"}},
    ],
)
def test_a_config_without_usable_stages_is_refused(tmp_path: Path, sections: dict) -> None:
    directory = _config(tmp_path / "b", **sections)
    with pytest.raises(CheckpointError, match="no usable"):
        bark_kv_plan(directory, "fp32")
