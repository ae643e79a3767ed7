"""Building engines from names and from the configuration: overrides, dtypes, the output
stage a model gets, and the engine the engine process serves (which says in its log, and
announces, which native kernels it runs)."""

from __future__ import annotations

import logging

import pytest
import torch

from cadenza.config import (
    CalibrationConfig,
    CpuConfig,
    EngineConfig,
    RealtimeConfig,
    load_config,
)
from cadenza.contract.kv_memory import StreamShape
from cadenza.contract.native_kernels import NO_COMPILER_NOTE
from cadenza.engine.audio_stage import AudioStage, TokenOutputs
from cadenza.engine.builder import (
    CPU_MAX_NUM_SEQS,
    CUDA_MAX_NUM_SEQS,
    build_engine,
    build_serving_engine,
    decode_graph_bytes,
    default_max_num_seqs,
    nominal_streams_held,
    pretrained_config,
)
from cadenza.engine.device import kv_dtype_name, resolve_dtype, resolve_kv_dtype
from cadenza.engine.engine import Engine
from cadenza.engine.identity import prompt_overhead_tokens
from cadenza.engine.naive_engine import NaiveEngine
from cadenza.kernels.native import loader
from tests.unit.engine.llama_checkpoints import save_tiny_llama


def test_keyword_overrides_and_dtypes() -> None:
    engine = build_engine(
        pretrained_config(
            "cadenza-tiny", page_size=8, max_num_seqs=3, kv_cache_memory_bytes=4 << 20
        )
    )
    assert (engine.config.engine.page_size, engine.scheduler.max_num_seqs) == (8, 3)
    fused = engine.model.fused_decode
    bf16_steps = fused is not None and fused.weight_dtype == torch.bfloat16
    assert engine.kv_cache.nbytes <= 4 << 20
    assert engine.kv_cache.dtype == (torch.bfloat16 if bf16_steps else torch.float32)
    assert isinstance(engine.audio, AudioStage)
    assert engine.info.shape.prompt_overhead_tokens == prompt_overhead_tokens(engine.model) == 2
    assert engine.identity_keys[0] == "cadenza-tiny"


def test_keyword_options_make_a_configuration_from_defaults_not_the_environment(
    monkeypatch,
) -> None:
    monkeypatch.setenv("CADENZA_ENGINE__PAGE_SIZE", "32")
    monkeypatch.setenv("CADENZA_MODEL__SEED", "9")
    config = pretrained_config(
        "some/model",
        seed=3,
        engine_config=EngineConfig(page_size=4, max_num_seqs=8),
        max_num_seqs=2,
        realtime=RealtimeConfig(chunk_ms=400.0),
        served_name="voice",
    )
    assert (config.model.name, config.model.seed, config.model.device) == ("some/model", 3, "cpu")
    assert (config.engine.page_size, config.engine.max_num_seqs) == (4, 2)  # the keyword wins
    assert config.realtime.chunk_ms == 400.0 and config.model.public_name == "voice"
    assert config.cpu == CpuConfig() and config.calibration == CalibrationConfig()
    with pytest.raises(ValueError, match="max_num_batched_tokens"):
        pretrained_config(max_num_seqs=600)


def test_a_text_model_gets_an_output_stage_without_audio(tmp_path) -> None:
    save_tiny_llama(tmp_path, "mha")
    engine = Engine.from_pretrained(str(tmp_path), kv_cache_memory_bytes=4 << 20)
    assert isinstance(engine.audio, TokenOutputs) and not isinstance(engine.audio, AudioStage)
    assert engine.info.shape.prompt_overhead_tokens == 0


def test_the_engine_process_serves_the_configured_kind(caplog) -> None:
    overrides = {"calibration": {"mode": "off"}, "engine": {"kv_cache_memory_bytes": 4 << 20}}
    with caplog.at_level(logging.INFO, logger="cadenza.engine.builder"):
        served = build_serving_engine(load_config(overrides=overrides))
    assert isinstance(served, Engine) and served.info.calibration is None
    assert served.info.native_kernels == loader.report()
    assert "native kernels" in caplog.text
    naive = build_serving_engine(load_config(overrides={"engine": {"kind": "naive"}}))
    assert isinstance(naive, NaiveEngine) and naive.info.native_kernels == loader.report()


def test_without_a_compiler_the_engine_warns_and_announces_its_kernels_off(
    monkeypatch, caplog
) -> None:
    monkeypatch.setattr(loader, "find_compiler", lambda: None)
    loader.clear_cache()
    try:
        overrides = {"engine": {"kind": "naive"}}
        with caplog.at_level(logging.WARNING, logger="cadenza.engine.builder"):
            naive = build_serving_engine(load_config(overrides=overrides))
        assert NO_COMPILER_NOTE in caplog.text
        kernels = naive.info.native_kernels
        assert kernels and all(kernel.status == "no_compiler" for kernel in kernels)
    finally:
        loader.clear_cache()


def test_dtype_names() -> None:
    assert resolve_dtype("auto", torch.device("cpu")) == torch.float32
    assert resolve_kv_dtype("auto", torch.bfloat16) == torch.bfloat16
    assert resolve_kv_dtype("auto", torch.float32) == torch.float32
    assert resolve_kv_dtype("auto", torch.float32, steps_read_bf16=True) == torch.bfloat16
    assert resolve_kv_dtype("fp32", torch.float32, steps_read_bf16=True) == torch.float32
    assert [kv_dtype_name(resolve_kv_dtype(n, torch.float32)) for n in ("fp16", "int8")] == [
        "fp16",
        "int8",
    ]
    with pytest.raises(ValueError):
        kv_dtype_name(torch.int32)


def test_cpu_precisions_follow_the_settings_and_key_the_prefix_cache() -> None:
    from cadenza.codecs import CodecError, load_codec
    from cadenza.engine.precision import codec_dtype
    from cadenza.kernels.cpu_linear import (
        PackedLinear,
        bf16_packing_available,
        native_bf16_matmul,
    )

    native = torch.bfloat16 if native_bf16_matmul() else torch.float32
    cpu = torch.device("cpu")
    encodec = load_codec("encodec_24khz", seed=0)
    snac = load_codec("snac_24khz", seed=0, noise=False)
    fp32 = torch.float32
    assert codec_dtype("auto", encodec, cpu, fp32, named=False) == native
    assert codec_dtype("auto", encodec, cpu, fp32, named=True) == fp32  # the user's float32
    assert codec_dtype("auto", snac, cpu, fp32, named=False) == fp32  # SNAC streams in fp32
    assert codec_dtype("float32", encodec, cpu, fp32, named=False) == fp32
    with pytest.raises(CodecError):
        codec_dtype("bfloat16", snac, cpu, fp32, named=False)
    dtypes = ("float32", "bfloat16") if bf16_packing_available() else ("float32",)
    if not bf16_packing_available():  # bf16 products asked of a CPU without them: said so
        with pytest.raises(ValueError, match=r"cpu\.linear_dtype = 'bfloat16'"):
            Engine.from_pretrained("cadenza-tiny", cpu=CpuConfig(linear_dtype="bfloat16"))
    engines = {
        dtype: Engine.from_pretrained(
            "cadenza-tiny",
            cpu=CpuConfig(linear_dtype=dtype, codec_dtype=dtype),
            kv_cache_memory_bytes=4 << 20,
        )
        for dtype in dtypes
    }
    for dtype, engine in engines.items():
        linears = [m for m in engine.model.modules() if isinstance(m, PackedLinear)]
        assert linears and {str(m.compute_dtype) for m in linears} == {f"torch.{dtype}"}
        assert isinstance(engine.audio, AudioStage)
        assert engine.audio.decoder.compute_dtype == getattr(torch, dtype)
    assert engines["float32"].runner.kv_cache.dtype == torch.float32
    if "bfloat16" not in engines:
        return
    # KV computed in another precision is other KV: the prefix cache keeps them apart.
    assert engines["float32"].identity_keys != engines["bfloat16"].identity_keys
    # With bf16 products on the fused step, the cache is bf16 too (half the bytes read).
    fused = engines["bfloat16"].model.fused_decode is not None
    bf16_cache = engines["bfloat16"].runner.kv_cache.dtype
    assert bf16_cache == (torch.bfloat16 if fused else torch.float32)


def test_max_num_seqs_unset_follows_the_device_within_the_step_budget() -> None:
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert default_max_num_seqs(EngineConfig(), cpu) == CPU_MAX_NUM_SEQS == 64
    assert default_max_num_seqs(EngineConfig(), cuda) == CUDA_MAX_NUM_SEQS == 256
    assert default_max_num_seqs(EngineConfig(max_num_batched_tokens=100), cuda) == 100
    assert default_max_num_seqs(EngineConfig(max_pending_requests=8), cpu) == 8
    engine = build_engine(pretrained_config("cadenza-tiny", kv_cache_memory_bytes=4 << 20))
    assert engine.config.engine.max_num_seqs is None and engine.scheduler.max_num_seqs == 64
    # On the CPU steps run eagerly: no pad page, no graphs, none of their memory reserved.
    assert engine.kv_cache.pad_page is None and engine.runner.static_decode is None
    assert decode_graph_bytes(engine.model, torch.float32, 16, 8, 4) == 0


def test_the_kv_cache_holds_nominal_streams_as_admission_counts_them() -> None:
    shape = StreamShape(page_size=16, steps_per_frame=7, tail_steps=0, prompt_overhead_tokens=20)
    # 10 s at 12 frames/s: 120 frames of 7 steps, after a prompt of at most 64 + 20 tokens.
    pages = shape.pages(shape.nominal_prompt_tokens, 120)
    assert pages == -(-(84 + 840) // 16)
    assert nominal_streams_held(pages * 5 + 3, shape, 12.0, 10.0) == 5
    assert nominal_streams_held(1, shape, 12.0, 10.0) == 1  # never none
