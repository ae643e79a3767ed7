"""The batch sizes of fixed-shape decode steps: few, bounded padding, the largest the limit."""

from __future__ import annotations

import pytest

from cadenza.engine.decode_buckets import bucket_for, decode_bucket_sizes


def test_sizes_double_to_eight_then_step_by_eight_and_sixteen() -> None:
    assert decode_bucket_sizes(64) == (1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64)
    assert decode_bucket_sizes(128)[-5:] == (64, 80, 96, 112, 128)
    assert len(decode_bucket_sizes(256)) == 23


def test_the_largest_size_is_the_limit_itself() -> None:
    assert decode_bucket_sizes(1) == (1,)
    assert decode_bucket_sizes(3) == (1, 2, 3)
    assert decode_bucket_sizes(70)[-2:] == (64, 70)


@pytest.mark.parametrize("limit", [1, 5, 64, 100, 256])
def test_every_batch_gets_the_smallest_size_that_holds_it(limit: int) -> None:
    sizes = decode_bucket_sizes(limit)
    for n in range(1, limit + 1):
        size = bucket_for(sizes, n)
        assert size >= n and size in sizes
        assert all(smaller < n for smaller in sizes if smaller < size)
        assert size - n < (8 if size <= 64 else 16)  # the padding the steps bound


def test_garbage_is_refused() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        decode_bucket_sizes(0)
    sizes = decode_bucket_sizes(8)
    with pytest.raises(ValueError, match="at least one row"):
        bucket_for(sizes, 0)
    with pytest.raises(ValueError, match="exceed the largest bucket 8"):
        bucket_for(sizes, 9)
