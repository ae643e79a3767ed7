"""The garbage collector's pauses: frozen start-up objects, later garbage still collected, the
exit quiet, long collections named in the log."""

from __future__ import annotations

import gc
import logging
import subprocess
import sys

import pytest

from cadenza import gc_pauses

_FROZEN_CHILD = """
import gc, time
from cadenza.gc_pauses import freeze_loaded_heap
import cadenza.engine.engine  # torch, transformers, triton: what an engine process loads

loaded = len(gc.get_objects())
frozen = freeze_loaded_heap()
assert frozen >= loaded // 2, (frozen, loaded)
assert len(gc.get_objects()) < loaded // 10  # the collector no longer walks them

class Node:
    pass

a, b = Node(), Node()
a.other, b.other = b, a  # a cycle: only the collector frees it
del a, b
assert gc.collect() >= 2  # made after the freeze: collected as before

started = time.perf_counter()
gc.collect()
print(f"full collection {1000 * (time.perf_counter() - started):.2f} ms")
"""


def test_a_frozen_process_still_collects_new_garbage_and_exits_quietly() -> None:
    done = subprocess.run(
        [sys.executable, "-c", _FROZEN_CHILD], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert "full collection" in done.stdout
    # Handed back at exit: extension modules that count their live objects report no leaks.
    assert "leaked" not in done.stderr


def test_long_collections_are_logged(caplog: pytest.LogCaptureFixture) -> None:
    before = list(gc.callbacks)
    try:
        gc_pauses.log_long_collections(threshold_ms=0.0)
        gc_pauses.log_long_collections(threshold_ms=0.0)  # installed once
        timers = [c for c in gc.callbacks if c not in before]
        assert len(timers) == 1
        with caplog.at_level(logging.WARNING, logger="cadenza.gc_pauses"):
            gc.collect()
        assert any("garbage collection of generation 2" in r.message for r in caplog.records)
        caplog.clear()
        gc_pauses.log_long_collections(threshold_ms=60_000.0)  # the threshold changes
        with caplog.at_level(logging.WARNING, logger="cadenza.gc_pauses"):
            gc.collect()
        assert not caplog.records
    finally:
        gc.callbacks[:] = before


def test_full_collections_wait_for_the_end_of_a_deferred_block(
    caplog: pytest.LogCaptureFixture,
) -> None:
    before_callbacks, thresholds = list(gc.callbacks), gc.get_threshold()
    try:
        gc_pauses.log_long_collections(threshold_ms=0.0)
        with caplog.at_level(logging.WARNING, logger="cadenza.gc_pauses"):
            with gc_pauses.full_collections_deferred():
                with gc_pauses.full_collections_deferred():  # nests
                    assert gc.get_threshold()[:2] == thresholds[:2]
                    assert gc.get_threshold()[2] > 1_000_000
                assert gc.get_threshold()[2] > 1_000_000
                caplog.clear()
            # The collection at the end is not a pause anyone measures: not logged.
            assert not caplog.records
        assert gc.get_threshold() == thresholds
    finally:
        gc.callbacks[:] = before_callbacks
        gc.set_threshold(*thresholds)
