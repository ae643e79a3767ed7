"""How much memory a device has free, for sizing the KV cache."""

from __future__ import annotations

import os

import torch


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
