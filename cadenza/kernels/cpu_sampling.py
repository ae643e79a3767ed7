"""The sampler's thresholded draw on the CPU in one native call (``native/cpu_sampling.cpp``).

:func:`cadenza.engine.sampler.sample_rows` draws serving batches (top-k, min-p, no top-p) by a
threshold per row and an inverse CDF in id order; in torch that is a dozen passes over ``[S, K,
V]`` and a partition, about 1.3 ms for a 10-stream cadenza-tiny batch on one core, for a
selection and a prefix sum per row. :func:`draw_thresholded` does the same arithmetic per row
in C++ (the kernel's header states it); ``None`` when there is no C++ compiler, and the
sampler keeps its torch path.
"""

from __future__ import annotations

from typing import Any

import torch

from cadenza.kernels.native import loader

LIBRARY = "cpu_sampling"


def _native() -> Any:
    return loader.function(LIBRARY, "cadenza_draw_thresholded")


def available() -> bool:
    """Whether the native draw is built and loaded on this machine."""
    return _native() is not None


def draw_thresholded(
    logits: torch.Tensor,
    temperature: list[float],
    top_k: list[int],
    min_p: list[float],
    uniform: torch.Tensor,
) -> torch.Tensor:
    """``logits [S, K, V]`` (CPU) -> ids ``[S, K]``: per sequence ``s``, from the ids at
    least as likely as its ``top_k[s]``-th best (``1 <= top_k[s] <= V``) and its ``min_p[s]``
    floor, at ``temperature[s] > 0``, by inverse CDF with ``uniform [S, K]``. Raises
    ``RuntimeError`` when the kernel is not available (check :func:`available`)."""
    function = _native()
    if function is None:
        raise RuntimeError(f"{LIBRARY} is not built on this machine")
    num_seqs, num_codebooks, vocab = logits.shape
    if not (len(temperature) == len(top_k) == len(min_p) == num_seqs):
        raise ValueError("one temperature, top_k and min_p per sequence")
    if uniform.shape != (num_seqs, num_codebooks):
        raise ValueError(f"uniform must be [{num_seqs}, {num_codebooks}]")
    if any(not 1 <= k <= vocab for k in top_k) or any(t <= 0 for t in temperature):
        raise ValueError("top_k must be in [1, vocab] and temperature > 0")
    rows = logits.detach().to(torch.float32).contiguous()
    draws = uniform.detach().to(torch.float32).contiguous()
    temperatures = torch.tensor(temperature, dtype=torch.float32)
    ks = torch.tensor(top_k, dtype=torch.int64)
    floors = torch.tensor(min_p, dtype=torch.float32)
    ids = torch.empty(num_seqs, num_codebooks, dtype=torch.int64)
    function(
        rows.data_ptr(),
        num_seqs * num_codebooks,
        vocab,
        num_codebooks,
        temperatures.data_ptr(),
        ks.data_ptr(),
        floors.data_ptr(),
        draws.data_ptr(),
        ids.data_ptr(),
    )
    return ids
