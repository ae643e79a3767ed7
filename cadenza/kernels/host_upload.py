"""Host values to the device without making the host wait.

A copy from ordinary (pageable) host memory to a GPU waits for the work already queued there
before it returns: every ``torch.tensor(values, device="cuda")`` in a step would stop the host
until the device caught up. Values a step uploads go through :func:`upload` instead: made in
pinned memory and copied without blocking (the caching host allocator keeps the pinned buffer
until the copy is done). Elsewhere it is a tensor on the host, made without naming a device, so
:class:`~cadenza.engine.device_audit.DeviceAudit` counts it apart from a blocking
``torch.tensor(values, device=...)`` on any machine.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch


def upload(values: Any, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """``values`` (nested lists, numbers, a numpy array or a host tensor) as a tensor of
    ``dtype`` on ``device``, copied without blocking the host on CUDA."""
    if device.type != "cuda":
        if isinstance(values, np.ndarray):
            return torch.from_numpy(values).to(dtype)
        if isinstance(values, torch.Tensor):
            return values.to(device=device, dtype=dtype)
        if device.type == "cpu":
            return torch.tensor(values, dtype=dtype)
        return torch.tensor(values, dtype=dtype, device=device)
    host = torch.as_tensor(values, dtype=dtype).pin_memory()
    return host.to(device, non_blocking=True)
