"""Each stream's random numbers, made on the device from what the host knows: the stream's seed,
how many rows it has drawn, and the codebook.

A sampled row takes one uniform per codebook. The uniform of stream ``s``, row ``r``, codebook
``k`` is a hash of ``(seed_s, r, k)`` (counter-based, as Philox is): no generator state lives
anywhere, so

* a stream draws the same numbers whatever else shares its batch, and in one batched call for
  the whole step (one upload of the keys, a handful of element-wise operations);
* a resumed stream draws on as it would have, with nothing to replay: its counter is the rows
  it holds (:attr:`~cadenza.engine.sequence.Sequence.rows_drawn`);
* a two-level model's depth decoder draws each level's codebook under the same row counter.

The hash is murmur3's 32-bit finalizer, chained over the seed's two halves, the counter and
the codebook. On an accelerator it runs in int64 torch operations with every product split so
nothing overflows; on the CPU in numpy's wrapping uint32 arithmetic (a step's few dozen values:
numpy's per-call cost is a fraction of torch's), with the same result (tested). A uniform keeps
the hash's top 24 bits, centred in its interval: ``(h + 0.5) / 2**24``, strictly inside (0, 1).
"""

from __future__ import annotations

import numpy as np
import torch

from cadenza.engine.sequence import Sequence
from cadenza.kernels.host_upload import upload

MASK32 = 0xFFFFFFFF
_SEED_SALT = 0x9E3779B9  # the golden ratio's bits: a zero seed does not hash to zero


def stream_uniforms(
    seqs: list[Sequence], first_codebook: int, num_codebooks: int, device: torch.device
) -> torch.Tensor:
    """``[S, K]`` float32 on ``device``: each stream's uniforms for its next row, codebooks
    ``first_codebook .. first_codebook + K - 1``."""
    if device.type == "cpu":
        return torch.from_numpy(_host_uniforms(seqs, first_codebook, num_codebooks))
    return uniforms(draw_keys(seqs, device), first_codebook, num_codebooks)


def draw_keys(seqs: list[Sequence], device: torch.device) -> torch.Tensor:
    """``[S, 3]`` int64 on ``device``: each stream's seed (low and high 32 bits) and the rows
    it has drawn (the counter of the row it draws now)."""
    rows = []
    for seq in seqs:
        seed = seq.generator.initial_seed()
        rows.append((seed & MASK32, (seed >> 32) & MASK32, seq.rows_drawn & MASK32))
    return upload(rows, torch.long, device)


def uniforms(keys: torch.Tensor, first_codebook: int, num_codebooks: int) -> torch.Tensor:
    """``[S, K]`` float32 in (0, 1): the uniforms of the rows ``keys`` (:func:`draw_keys`)
    name, codebooks ``first_codebook .. first_codebook + K - 1``."""
    codebooks = torch.arange(
        first_codebook, first_codebook + num_codebooks, device=keys.device, dtype=torch.long
    )
    mixed = _fmix32(keys[:, 0:1] ^ _SEED_SALT)
    mixed = _fmix32(mixed ^ keys[:, 1:2])
    mixed = _fmix32(mixed ^ keys[:, 2:3])
    mixed = _fmix32(mixed ^ codebooks[None, :])
    return ((mixed >> 8).to(torch.float32) + 0.5) * (2.0**-24)


def _host_uniforms(seqs: list[Sequence], first_codebook: int, num_codebooks: int) -> np.ndarray:
    """:func:`uniforms` of ``seqs`` in numpy (uint32 arithmetic wraps as the hash wants)."""
    seeds = np.array([seq.generator.initial_seed() for seq in seqs], dtype=np.uint64)
    low = (seeds & MASK32).astype(np.uint32)[:, None]
    high = (seeds >> np.uint64(32)).astype(np.uint32)[:, None]
    counters = np.array([seq.rows_drawn & MASK32 for seq in seqs], dtype=np.uint32)[:, None]
    codebooks = np.arange(first_codebook, first_codebook + num_codebooks, dtype=np.uint32)
    with np.errstate(over="ignore"):
        mixed = _host_fmix32(low ^ np.uint32(_SEED_SALT))
        mixed = _host_fmix32(mixed ^ high)
        mixed = _host_fmix32(mixed ^ counters)
        mixed = _host_fmix32(mixed ^ codebooks[None, :])
    return ((mixed >> np.uint32(8)).astype(np.float32) + np.float32(0.5)) * np.float32(2.0**-24)


def _host_fmix32(h: np.ndarray) -> np.ndarray:
    h = h ^ (h >> np.uint32(16))
    h = h * np.uint32(0x85EBCA6B)
    h = h ^ (h >> np.uint32(13))
    h = h * np.uint32(0xC2B2AE35)
    return h ^ (h >> np.uint32(16))


def _fmix32(h: torch.Tensor) -> torch.Tensor:
    """Murmur3's finalizer over int64 tensors holding 32-bit values."""
    h = h ^ (h >> 16)
    h = _mul32(h, 0x85EBCA6B)
    h = h ^ (h >> 13)
    h = _mul32(h, 0xC2B2AE35)
    return h ^ (h >> 16)


def _mul32(h: torch.Tensor, constant: int) -> torch.Tensor:
    """``h * constant mod 2**32`` for 32-bit ``h`` and ``constant``, with no product above
    2**49 (each half of ``h`` multiplied alone)."""
    low = (h & 0xFFFF) * constant
    high = ((h >> 16) * constant) & 0xFFFF
    return (low + (high << 16)) & MASK32
