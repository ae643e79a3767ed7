"""Whether Triton is installed, and whether its kernels can run on a device.

Triton runs on a CUDA device, and on the CPU when ``TRITON_INTERPRET=1`` was set before Triton
was imported (the interpreter: fp16/fp32 only; how CI checks the kernels, too slow to serve).
Nothing here imports Triton itself: the kernels' modules do, when first used.
"""

from __future__ import annotations

import functools
import importlib.util
import os

import torch


@functools.cache
def triton_installed() -> bool:
    return importlib.util.find_spec("triton") is not None


def triton_can_run(device: torch.device) -> bool:
    """Whether the Triton kernels can run on tensors on ``device`` (the interpreter counts)."""
    if not triton_installed():
        return False
    if device.type == "cuda":
        return True
    return device.type == "cpu" and os.environ.get("TRITON_INTERPRET") == "1"
