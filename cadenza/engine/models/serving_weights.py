"""Weights rearranged for serving, once, after loading: fewer and faster matrix products.

Every backbone (:class:`~cadenza.engine.models.model.ServingBackbone`) gets its q/k/v and
gate/up projections fused into single matrices; then every
bias-free linear is either made weight-only int8 (``weights_dtype = "int8"``; on the CPU these
come prepacked too) or, for fp32 on the CPU, prepacked for oneDNN (2-4x faster at the row
counts of a decode step; docs/journal/2026-11-29-first-measurements.md), in fp32 or, with
``cpu_linear_dtype = bf16``, for the CPU's bf16 matrix units. Outputs agree with the
unmodified model to float rounding (int8: to its quantization; bf16: to bf16 rounding of the
products' inputs).
"""

from __future__ import annotations

import torch

from cadenza.engine.models.model import AudioTokenModel
from cadenza.kernels.cpu_linear import pack_linears, packing_available
from cadenza.kernels.int8_linear import quantize_linears


def prepare_for_serving(
    model: AudioTokenModel,
    *,
    weights_dtype: str = "auto",
    pack_cpu_weights: bool = True,
    cpu_linear_dtype: torch.dtype = torch.float32,
    fused_cpu_decode: bool = True,
) -> None:
    """Rearrange ``model``'s weights in place (call once, after loading). On the CPU, with
    ``fused_cpu_decode``, its backbones' decode steps also get the native kernel
    (:mod:`cadenza.kernels.fused_cpu_decode`), multiplying in ``cpu_linear_dtype``."""
    backbones = model.serving_backbones()
    for backbone in backbones:
        backbone.fuse_projections()
    if weights_dtype == "int8":
        quantize_linears(model)
        return
    if pack_cpu_weights and packing_available(model.device, model.dtype):
        pack_linears(model, cpu_linear_dtype)
    if fused_cpu_decode and model.device.type == "cpu" and model.dtype == torch.float32:
        for backbone in backbones:
            backbone.enable_fused_cpu_decode(cpu_linear_dtype)
