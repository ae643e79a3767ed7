"""``[cpu]``: how an engine on the CPU computes (``kernels/cpu_linear.py``,
``kernels/fused_cpu_decode.py``, the streaming codec's dtype; docs/precision.md). On a GPU
these have no effect."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from cadenza.config.section import Section


class CpuConfig(Section):
    """The CPU's fast paths: packed and bf16 products, the fused decode step, the codec dtype."""

    pack_weights: bool = Field(
        True, description="prepack fp32 linear weights for oneDNN on the CPU (faster decode)"
    )
    linear_dtype: Literal["auto", "float32", "bfloat16"] = Field(
        "auto",
        description="dtype the CPU's prepacked linears multiply in (weights stay fp32): "
        "auto is bfloat16 where the CPU has native bf16 matrix units (AMX or AVX512-BF16) and "
        "model.dtype is auto, else float32; output heads give float32 logits either way "
        "(docs/precision.md)",
    )
    fused_decode: bool = Field(
        True,
        description="on the CPU, run Llama backbones' steps through the native kernel "
        "(compiled once per machine with the system's C++ compiler; without one, or with "
        "int8 weights or an fp16 or int8 KV cache, steps stay on torch)",
    )
    codec_dtype: Literal["auto", "float32", "bfloat16"] = Field(
        "auto",
        description="dtype the streaming codec decoder computes in on the CPU: auto is "
        "bfloat16 where the CPU has native bf16 matrix units, the codec supports it "
        "(EnCodec) and model.dtype is auto, else float32 (always float32 on a GPU)",
    )
