"""Building engines from names and from the configuration: overrides, dtypes, the output
stage a model gets, and the engine the engine process serves."""

from __future__ import annotations

import pytest
import torch

from cadenza.config import load_config
from cadenza.engine.audio_stage import AudioStage, TokenOutputs
from cadenza.engine.builder import build_engine, build_serving_engine
from cadenza.engine.device import kv_dtype_name, resolve_dtype, resolve_kv_dtype
from cadenza.engine.engine import Engine
from cadenza.engine.identity import prompt_overhead_tokens
from cadenza.engine.naive_engine import NaiveEngine
from tests.unit.engine.llama_checkpoints import save_tiny_llama


def test_keyword_overrides_and_dtypes() -> None:
    engine = build_engine(
        "cadenza-tiny", page_size=8, max_num_seqs=3, kv_cache_memory_bytes=4 << 20
    )
    assert (engine.config.page_size, engine.scheduler.max_num_seqs) == (8, 3)
    assert engine.kv_cache.nbytes <= 4 << 20 and engine.kv_cache.dtype == torch.float32
    assert isinstance(engine.audio, AudioStage)
    assert engine.info.shape.prompt_overhead_tokens == prompt_overhead_tokens(engine.model) == 2
    assert engine.identity_keys[0] == "cadenza-tiny"


def test_a_text_model_gets_an_output_stage_without_audio(tmp_path) -> None:
    save_tiny_llama(tmp_path, "mha")
    engine = build_engine(str(tmp_path), kv_cache_memory_bytes=4 << 20)
    assert isinstance(engine.audio, TokenOutputs) and not isinstance(engine.audio, AudioStage)
    assert engine.info.shape.prompt_overhead_tokens == 0


def test_the_engine_process_serves_the_configured_kind() -> None:
    overrides = {"engine": {"calibration": "off", "kv_cache_memory_bytes": 4 << 20}}
    served = build_serving_engine(load_config(overrides=overrides))
    assert isinstance(served, Engine) and served.info.calibration is None
    naive = build_serving_engine(load_config(overrides={"engine": {"kind": "naive"}}))
    assert isinstance(naive, NaiveEngine)


def test_dtype_names() -> None:
    assert resolve_dtype("auto", torch.device("cpu")) == torch.float32
    assert resolve_kv_dtype("auto", torch.bfloat16) == torch.bfloat16
    assert [kv_dtype_name(resolve_kv_dtype(n, torch.float32)) for n in ("fp16", "int8")] == [
        "fp16",
        "int8",
    ]
    with pytest.raises(ValueError):
        kv_dtype_name(torch.int32)
