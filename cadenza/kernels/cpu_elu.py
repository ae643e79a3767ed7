"""ELU on the CPU through a native kernel: what every SEANet codec decoder's activations run.

torch's CPU ELU evaluates ``expm1`` an element at a time, 1.5-1.7 ns an element here: at a
codec decoder's high-rate end, where every ELU touches tens of thousands of values a frame,
that was a fifth of EnCodec's streaming decode. :func:`elu` computes the same function
sixteen lanes at a time in ``native/cpu_elu.cpp`` (float32 within a few ulp of torch, bfloat16
computed in float32 and rounded to nearest even as torch does), over any dense tensor's
storage. Anything else (another device or dtype, a strided view, no C++ compiler) goes to
``torch.nn.functional.elu``.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from cadenza.kernels.native import loader

LIBRARY = "cpu_elu"
_ENTRY_POINTS = {torch.float32: "cadenza_elu_f32", torch.bfloat16: "cadenza_elu_bf16"}


def _native(dtype: torch.dtype) -> Any:
    """The kernel's entry point for ``dtype`` (``None``: no kernel for it, or no library)."""
    name = _ENTRY_POINTS.get(dtype)
    return None if name is None else loader.function(LIBRARY, name)


def _is_dense(x: torch.Tensor) -> bool:
    """Whether ``x``'s elements fill one block of memory without overlap (any order)."""
    if x.is_contiguous():
        return True
    order = sorted(
        ((stride, size) for stride, size in zip(x.stride(), x.shape, strict=True) if size > 1),
    )
    expected = 1
    for stride, size in order:
        if stride != expected:
            return False
        expected *= size
    return True


def elu(x: torch.Tensor, alpha: float = 1.0, inplace: bool = False) -> torch.Tensor:
    """``torch.nn.functional.elu(x, alpha, inplace)``; the result has ``x``'s strides."""
    function = None
    if x.device.type == "cpu" and not x.requires_grad and _is_dense(x):
        function = _native(x.dtype)
    if function is None:
        return F.elu(x, alpha, inplace=inplace)
    out = x if inplace else torch.empty_like(x)
    if x.numel():
        function(x.data_ptr(), out.data_ptr(), x.numel(), alpha)
    return out
