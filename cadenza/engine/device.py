"""The device the engine runs on: which one, in which dtypes, how much memory it has free, and
its name (calibrations are cached per device)."""

from __future__ import annotations

import os
import platform
from pathlib import Path

import torch

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
_KV_DTYPES = {
    "fp32": torch.float32,
    "fp16": torch.float16,
    "bf16": torch.bfloat16,
    "int8": torch.int8,
}


def resolve_device(device: str) -> torch.device:
    """``"auto"`` -> cuda when available, else cpu. Raises ``ValueError`` for cuda without GPU."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError("device 'cuda' requested but no CUDA device is available")
    return torch.device(device)


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    """``"auto"`` -> float32 on cpu (no fast bf16 there), bfloat16 on cuda."""
    if dtype == "auto":
        return torch.float32 if device.type == "cpu" else torch.bfloat16
    return _DTYPES[dtype]


def resolve_kv_dtype(
    kv_dtype: str, model_dtype: torch.dtype, steps_read_bf16: bool = False
) -> torch.dtype:
    """``"auto"`` -> the model's dtype, except bfloat16 for a float32 model whose steps already
    multiply in bfloat16 and read a bfloat16 cache directly (``steps_read_bf16``: the fused CPU
    step with bf16 products): half the bytes a step's attention reads, for the precision its
    products already have. Otherwise the named one (int8: quantized pages)."""
    if kv_dtype != "auto":
        return _KV_DTYPES[kv_dtype]
    if steps_read_bf16 and model_dtype == torch.float32:
        return torch.bfloat16
    return model_dtype


def kv_dtype_name(dtype: torch.dtype) -> str:
    """The contract's name of a KV dtype (``fp32``, ``fp16``, ``bf16``, ``int8``)."""
    for name, value in _KV_DTYPES.items():
        if value == dtype:
            return name
    raise ValueError(f"{dtype} is not a KV cache dtype")


def available_memory_bytes(device: torch.device) -> int:
    """Free bytes on ``device``: the CUDA allocator's view on a GPU, ``MemAvailable`` on CPU."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free)
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return int(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))


def device_name(device: torch.device) -> str:
    """A human-readable name of the device that runs the steps (the CPU model on CPU)."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return f"{line.split(':', 1)[1].strip()} x{os.cpu_count()}"
    except OSError:
        pass
    return f"{platform.processor() or platform.machine()} x{os.cpu_count()}"
