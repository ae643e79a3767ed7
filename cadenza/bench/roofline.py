"""What this machine can do at best: memory bandwidth and GEMM rate, measured now.

A decode step must at least read every weight once (``weight_bytes / read_bandwidth``) and do
``2 * parameters * batch`` FLOPs (``/ gemm_rate``); the larger of the two is its roofline.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch


def _median_seconds(fn: Callable[[], object], repeats: int) -> float:
    fn()  # warm up
    samples = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - started)
    return statistics.median(samples)


def measure_read_bandwidth(num_bytes: int = 256 << 20, repeats: int = 7) -> float:
    """Bytes per second for streaming reads (a sum over a buffer much larger than caches)."""
    data = torch.ones(num_bytes // 4, dtype=torch.float32)
    return num_bytes / _median_seconds(data.sum, repeats)


def measure_copy_bandwidth(num_bytes: int = 256 << 20, repeats: int = 7) -> float:
    """Bytes per second moved by a copy (read + write counted)."""
    src = torch.ones(num_bytes // 4, dtype=torch.float32)
    dst = torch.empty_like(src)
    return 2 * num_bytes / _median_seconds(lambda: dst.copy_(src), repeats)


def measure_gemm_flops(m: int, n: int, k: int, repeats: int = 7) -> float:
    """FLOP per second of an ``[m, k] @ [k, n]`` fp32 product."""
    a, b = torch.randn(m, k), torch.randn(k, n)
    return 2 * m * n * k / _median_seconds(lambda: a @ b, repeats)


def measure_roofline() -> dict[str, float]:
    return {
        "read_bandwidth_gbps": measure_read_bandwidth() / 1e9,
        "copy_bandwidth_gbps": measure_copy_bandwidth() / 1e9,
        "gemm_gflops_2048": measure_gemm_flops(2048, 2048, 2048) / 1e9,
    }
