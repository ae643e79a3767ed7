"""Engine settings for tests that compare against a float32 reference (``transformers``, the
``snac`` package, a full recompute): the CPU's bf16 fast paths off, so equality is to float32
rounding. The bf16 paths have their own accuracy tests."""

from __future__ import annotations

from cadenza.config import EngineConfig

FLOAT32_COMPUTE = {"cpu_linear_dtype": "float32", "codec_dtype": "float32"}


def float32_engine_config(**fields: object) -> EngineConfig:
    """An :class:`EngineConfig` with ``fields`` and float32 compute everywhere."""
    return EngineConfig.model_validate({**FLOAT32_COMPUTE, **fields})
