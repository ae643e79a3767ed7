"""This node's open streams per holder: a holder gets ``limit`` at once and no more, a stream
counts once however often it is counted, and a release frees exactly what it counted."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cadenza.edge.admission.client_streams import NodeStreams, StreamSlot, TooManyStreams


def test_a_holder_gets_the_limit_and_each_release_frees_one() -> None:
    streams = NodeStreams(2)
    first = streams.admit("key:a", "s1")
    streams.admit("key:a", "s2")
    with pytest.raises(TooManyStreams) as refused:
        streams.admit("key:a", "s3")
    assert refused.value.limit == 2 and "limits.max_streams_per_client" in str(refused.value)
    streams.admit("key:b", "s3")  # another holder: its own count
    assert streams.count("key:a") == 2 and streams.count("key:b") == 1
    assert streams.release(first)
    streams.admit("key:a", "s4")
    streams.check_integrity()


def test_a_release_counts_once() -> None:
    streams = NodeStreams(1)
    slot = streams.admit("key:a", "s1")
    assert streams.release(slot) and not streams.release(slot)
    assert slot.released and streams.count("key:a") == 0 and not streams.open_slots()
    streams.check_integrity()


def test_a_stream_counted_again_counts_once_and_the_old_slot_frees_nothing() -> None:
    """A stream resumed on the node that had it (its client came back before its old
    connection was noticed gone): one count, which only the newer slot gives back."""
    streams = NodeStreams(1)
    old = streams.admit("key:a", "s1")
    new = streams.admit("key:a", "s1")
    assert streams.count("key:a") == 1
    assert not streams.release(old) and streams.count("key:a") == 1
    assert streams.release(new) and streams.count("key:a") == 0


def test_a_limit_of_zero_counts_nothing() -> None:
    streams = NodeStreams(0)
    slots = [asyncio.run(streams.acquire("ip:10.0.0.1", f"s{i}")) for i in range(100)]
    assert streams.count("ip:10.0.0.1") == 0 and not streams.open_slots()
    assert not any(streams.release(slot) for slot in slots)


@settings(max_examples=200, deadline=None)
@given(
    limit=st.integers(1, 3),
    steps=st.lists(st.tuples(st.booleans(), st.sampled_from("ab"), st.integers(0, 5)), max_size=40),
)
def test_the_count_is_the_open_streams_whatever_the_order(
    limit: int, steps: list[tuple[bool, str, int]]
) -> None:
    """Admit (``True``) or release (``False``) stream ``i`` of holder ``h``, in any order:
    the count is always the distinct streams admitted and not yet released, never over the
    limit."""
    streams = NodeStreams(limit)
    slots: dict[tuple[str, int], StreamSlot] = {}
    for admit, holder, index in steps:
        if admit:
            try:
                slots[(holder, index)] = streams.admit(holder, str(index))
            except TooManyStreams:
                assert streams.count(holder) == limit
        elif (holder, index) in slots:
            streams.release(slots.pop((holder, index)))
        streams.check_integrity()
        for name in "ab":
            assert streams.count(name) == sum(h == name for h, _ in slots) <= limit
