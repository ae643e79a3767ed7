"""``cadenza plan --model BARK_DIR``: the KV memory a Bark stream holds, stage by stage, from
``config.json`` alone.

The semantic and coarse stages are causal GPTs whose context never passes their block size
(the prompt and the tokens of one run, a coarse window's prompt included), so a stream's slot in
each is exactly ``block_size`` positions; the engine counts both for every stream (a stream
moves from one to the other, and each stage's pool keeps its slots). The fine stage is
non-causal and keeps no KV.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cadenza.contract.kv_memory import kv_bytes_per_token
from cadenza.engine.models.bark.bark_gpt import GPTShape
from cadenza.engine.models.checkpoint import CheckpointError, read_json

CAUSAL_STAGES = {"semantic": "semantic_config", "coarse": "coarse_acoustics_config"}


def bark_kv_plan(
    directory: Path, kv_dtype: str, memory_bytes: int | None = None, weights_bytes: int = 0
) -> dict[str, Any]:
    """Each causal stage's shape and KV bytes per stream, their sum, and (with
    ``memory_bytes``) how many streams fit beside ``weights_bytes`` of weights. Raises
    ``CheckpointError`` for a config without the stages."""
    config = read_json(directory / "config.json")
    result: dict[str, Any] = {"family": "bark", "kv_dtype": kv_dtype}
    per_stream = 0
    for stage, key in CAUSAL_STAGES.items():
        try:
            shape = GPTShape.from_config(config[key])
        except (KeyError, TypeError, ValueError) as exc:
            raise CheckpointError(f"{directory}: config.json has no usable {key}: {exc}") from exc
        per_token = kv_bytes_per_token(shape.num_layers, shape.num_heads, shape.head_dim, kv_dtype)
        stage_bytes = per_token * shape.block_size
        per_stream += stage_bytes
        result[f"{stage}_layers"] = shape.num_layers
        result[f"{stage}_heads"] = shape.num_heads
        result[f"{stage}_head_dim"] = shape.head_dim
        result[f"{stage}_positions"] = shape.block_size
        result[f"{stage}_kv_bytes_per_stream"] = stage_bytes
    result["fine_kv_bytes_per_stream"] = 0
    result["kv_bytes_per_stream"] = per_stream
    if memory_bytes is not None:
        budget = max(memory_bytes - weights_bytes, 0)
        result["memory_bytes"] = memory_bytes
        result["kv_budget_bytes"] = budget
        result["streams_that_fit"] = budget // per_stream
    return result
