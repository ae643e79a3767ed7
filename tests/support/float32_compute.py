"""Engine settings for tests that compare against a float32 reference (``transformers``, the
``snac`` package, a full recompute): the CPU's bf16 fast paths off, so equality is to float32
rounding. The bf16 paths have their own accuracy tests."""

from __future__ import annotations

from cadenza.config import CpuConfig
from cadenza.engine.engine import Engine
from cadenza.kernels.native.loader import find_compiler

FLOAT32_COMPUTE = {"linear_dtype": "float32", "codec_dtype": "float32"}  # [cpu]


def float32_cpu_config(**fields: object) -> CpuConfig:
    """A :class:`CpuConfig` with ``fields`` and float32 compute everywhere."""
    return CpuConfig.model_validate({**FLOAT32_COMPUTE, **fields})


def assert_float32_named_with_the_fused_step(engine: Engine) -> None:
    """``engine`` was built with ``dtype="float32"`` named: float32 products and KV cache, and
    its steps on the fused native kernel wherever a C++ compiler is."""
    assert engine.precision is not None and engine.precision.chosen_by == "named"
    assert (engine.precision.products, engine.precision.kv_cache) == ("float32", "fp32")
    assert engine.runner.fused_decode == (find_compiler() is not None)
