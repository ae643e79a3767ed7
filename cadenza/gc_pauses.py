"""Keeping Python's garbage collector from stalling a real-time process.

CPython's cyclic collector walks every object it tracks on a full (oldest-generation)
collection. A process that has loaded torch, transformers and a model holds hundreds of
thousands of them: on the 2-core development machine the engine process (cadenza-tiny) tracked
about 374,000 objects after loading, and one full collection took 214-233 ms; the edge
about 85,000, 56 ms (``benchmarks/gc_pauses.py``). Full collections come whenever the objects
that survived younger collections since the last one reach a quarter of the old ones, so
under load they come at unpredictable moments, and every stream of the process stalls for the
whole pause: a new stream between its first chunk and its second may have only a few
milliseconds to spare (docs/capacity.md, "Chunk sizes").

:func:`freeze_loaded_heap` is called once a process has loaded what it keeps for its life
(models, modules, configuration): it collects once, then moves every tracked object into the
permanent generation (:func:`gc.freeze`), which collections skip. Objects made later are
collected as before; a full collection then walks only them (well under a millisecond after
loading). Nothing is lost but the cost of looking at objects that were never going to be
garbage. At exit they are handed back (:func:`gc.unfreeze`) so the interpreter's own shutdown
sees them as usual (extension modules that count their live objects at exit, such as
triton's, otherwise report leaks).

:func:`log_long_collections` logs every collection that takes longer than a threshold, so
a pause that still happens is named in the log rather than left to be guessed from gaps in
the audio. :func:`settle_after_loading` is what a process's entry point calls once it has
loaded: both (the freeze where configured, ``server.gc_freeze``).

The load tester keeps what it measures (every chunk's arrival, of every stream of a level)
alive until the level ends, and its full collections walk all of it: 81 ms in a two-minute
level of 14 streams, a gap in every stream's audio that the server never made.
:func:`full_collections_deferred` runs a level with full collections put off to its end
(young collections go on, so short-lived cycles are still freed as they come).
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import logging
import time
from collections.abc import Iterator
from typing import Any

log = logging.getLogger(__name__)

LONG_COLLECTION_MS = 20.0  # a collection longer than this is logged
_unfreeze_at_exit = False  # whether the exit hook is registered
# The oldest generation's threshold inside full_collections_deferred: that many collections
# of the middle generation first, i.e. never within a load-test level.
_DEFERRED_OLD_THRESHOLD = 1 << 30


def freeze_loaded_heap() -> int:
    """Collect, then exclude every object alive now from later collections (see the module
    docstring); returns how many objects were frozen. Call once loading is done; calling it
    again freezes what has been made since."""
    global _unfreeze_at_exit
    gc.collect()
    gc.freeze()
    frozen = gc.get_freeze_count()
    if not _unfreeze_at_exit:
        atexit.register(gc.unfreeze)
        _unfreeze_at_exit = True
    log.debug("froze %d loaded objects out of the garbage collector's walks", frozen)
    return frozen


class _CollectionTimer:
    """A ``gc.callbacks`` entry that times each collection and logs the long ones."""

    def __init__(self, threshold_ms: float) -> None:
        self.threshold_ms = threshold_ms
        self.quiet = False  # a collection asked for where a pause costs nothing
        self._started = 0.0

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if self.quiet:
            return
        if phase == "start":
            self._started = time.perf_counter()
            return
        ms = 1000.0 * (time.perf_counter() - self._started)
        if ms > self.threshold_ms:
            log.warning(
                "garbage collection of generation %s took %.0f ms (%s objects collected)",
                info.get("generation"),
                ms,
                info.get("collected"),
            )


def log_long_collections(threshold_ms: float = LONG_COLLECTION_MS) -> None:
    """Log a warning for every garbage collection of this process that takes longer than
    ``threshold_ms`` (installed once; a second call only changes the threshold)."""
    for callback in gc.callbacks:
        if isinstance(callback, _CollectionTimer):
            callback.threshold_ms = threshold_ms
            return
    gc.callbacks.append(_CollectionTimer(threshold_ms))


def settle_after_loading(freeze: bool) -> None:
    """What a process does once it has loaded everything it keeps: freeze it out of the
    collector's walks (``freeze``, see :func:`freeze_loaded_heap`), and from now on log every
    long collection (:func:`log_long_collections`; start-up's own are not logged)."""
    if freeze:
        freeze_loaded_heap()
    log_long_collections()


@contextlib.contextmanager
def full_collections_deferred() -> Iterator[None]:
    """No full collection inside the block (young and middle ones go on); one at its end,
    not logged (nothing is being measured then). Nests."""
    young, middle, old = gc.get_threshold()
    gc.set_threshold(young, middle, _DEFERRED_OLD_THRESHOLD)
    try:
        yield
    finally:
        gc.set_threshold(young, middle, old)
        timers = [c for c in gc.callbacks if isinstance(c, _CollectionTimer)]
        for timer in timers:
            timer.quiet = True
        try:
            gc.collect()
        finally:
            for timer in timers:
                timer.quiet = False
