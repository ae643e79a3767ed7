"""The batch sizes a decode step runs at when its shapes are fixed (CUDA graphs are captured
once per size): 1, 2, 4, 8, then steps of 8 up to 64 and of 16 beyond, the last one
``max_num_seqs`` itself. A step of ``n`` decodes runs at the smallest size that holds it; the
rows past ``n`` are padding (:mod:`cadenza.engine.static_decode`).

The steps bound the padding: at most 7 rows in 64, 15 in 256 (a padded row costs a row of
every product and one key of attention, never a row of the real ones' results).
"""

from __future__ import annotations

import bisect

FINE_STEP = 8
"""Sizes step by this up to :data:`FINE_LIMIT`."""
FINE_LIMIT = 64
COARSE_STEP = 16
"""Sizes step by this past :data:`FINE_LIMIT`."""


def decode_bucket_sizes(max_num_seqs: int) -> tuple[int, ...]:
    """Every batch size a fixed-shape decode step runs at, ascending, for at most
    ``max_num_seqs`` decodes a step (the largest size is ``max_num_seqs``)."""
    if max_num_seqs < 1:
        raise ValueError(f"max_num_seqs must be at least 1, got {max_num_seqs}")
    sizes = [size for size in (1, 2, 4) if size < max_num_seqs]
    size = FINE_STEP
    while size < max_num_seqs:
        sizes.append(size)
        size += FINE_STEP if size < FINE_LIMIT else COARSE_STEP
    sizes.append(max_num_seqs)
    return tuple(sizes)


def bucket_for(sizes: tuple[int, ...], num_decodes: int) -> int:
    """The smallest of ``sizes`` (ascending) that holds ``num_decodes`` rows; ``ValueError``
    when none does or ``num_decodes`` is not positive."""
    if num_decodes < 1:
        raise ValueError(f"a decode step has at least one row, got {num_decodes}")
    index = bisect.bisect_left(sizes, num_decodes)
    if index == len(sizes):
        raise ValueError(f"{num_decodes} decodes exceed the largest bucket {sizes[-1]}")
    return sizes[index]
