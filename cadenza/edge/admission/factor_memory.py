"""The realtime factor a server last measured, kept across restarts.

A fresh server knows only its calibration, measured with nothing else running; once serving,
the edge and the clients share the engine's cores and live steps run slower than calibrated
(:meth:`CapacityModel.realtime_factor`). Until a restarted server has live windows of its
own, admission starts from the factor the last server on this machine measured for the same
calibration and replica count, instead of the calibration's optimism: its ``max_streams``
is then about what it will hold under load from the first request on. Live measurements
replace the remembered factor as soon as there are enough of them.

Only a factor measured under load is worth passing on (:func:`measured_under_load`): with few
streams running, the edge and the clients leave the engine more of the cores and live steps
come closer to the calibration, so a factor saved as a server winds down (or idles after a
light spell) would promise the next one more than it holds once loaded (a restarted server
claimed 20 streams before a sweep that held 16:
docs/journal/2026-12-03-audio-way-out-and-native-bf16-linears.md).

A remembered factor is a hint, not a verdict: it comes back with its age
(:class:`RememberedFactor`), and admission lets it fade towards the unmeasured default as it
ages and caps it (``admission.remembered_factor_half_life_s``,
``admission.remembered_factor_cap``; :mod:`cadenza.edge.admission.realtime_factor`).

One small JSON file beside the calibrations (``calibration.cache_dir``, default
``~/.cache/cadenza``), ``{key: {"factor": f, "at": unix seconds}}``, written atomically;
unreadable content counts as nothing remembered, and an entry that is not one this code
writes (a factor outside 1-20, a time in the future, a bare number) is ignored with a
warning. A server reads it once, when its memory is made (at start-up),
and writes it from the memory's own thread (:meth:`FactorMemory.remember_soon`), never from
its event loop: under load one write and rename held the edge's loop for up to 430 ms, and
every stream's audio with it. A replica that (re)starts while others serve recalls from memory.
"""

from __future__ import annotations

import json
import logging
import math
import os
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

FILE_NAME = "realtime-factors.json"
_LIMITS = (1.0, 20.0)  # a remembered factor outside these is not one this code wrote
_KEPT = 64  # keys kept in the file (the most recently written)
LOADED_SHARE = 0.5  # the share of its own claim a replica runs while its factor is remembered


@dataclass(frozen=True)
class RememberedFactor:
    """A factor an earlier server measured under load, ``age_s`` seconds ago."""

    factor: float
    age_s: float


def measured_under_load(running: int, claimed: int) -> bool:
    """Whether a replica running ``running`` streams against a claim of ``claimed`` is loaded
    enough for its live factor to be remembered: at least :data:`LOADED_SHARE` of the claim,
    and at least one stream."""
    return running >= max(1.0, LOADED_SHARE * claimed)


def default_dir(calibration_cache_dir: str | None) -> Path:
    """Where calibrations (and so the factors) are kept."""
    if calibration_cache_dir:
        return Path(calibration_cache_dir)
    root = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return Path(root) / "cadenza"


class FactorMemory:
    """The file's factors, read once here; :meth:`recall` answers from memory, kept up to date
    by this memory's own writes (another server's later writes are seen by the next start).
    ``clock``: wall-clock seconds (the file outlives the process)."""

    def __init__(self, directory: Path, clock: Callable[[], float] = time.time) -> None:
        self.path = directory / FILE_NAME
        self.clock = clock
        # one writer, so that writes land in the order they were asked for, never interleaved
        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="cadenza-factors")
        self._known = self._read(warn=True)

    def _read(self, warn: bool = False) -> dict[str, tuple[float, float]]:
        """``{key: (factor, measured at)}`` from the file; with ``warn``, what is ignored is
        logged."""
        try:
            raw = json.loads(self.path.read_text())
        except OSError:
            return {}
        except ValueError:
            if warn:
                log.warning("ignoring %s: not JSON", self.path)
            return {}
        if not isinstance(raw, dict):
            if warn:
                log.warning("ignoring %s: not a map of remembered factors", self.path)
            return {}
        known: dict[str, tuple[float, float]] = {}
        for key, entry in raw.items():
            parsed = self._entry(entry)
            if parsed is None:
                if warn:
                    log.warning(
                        "ignoring the remembered factor %r in %s: %r", key, self.path, entry
                    )
                continue
            known[str(key)] = parsed
        return known

    def _entry(self, entry: object) -> tuple[float, float] | None:
        if not isinstance(entry, dict):
            return None
        factor, at = entry.get("factor"), entry.get("at")
        if not isinstance(factor, int | float) or not isinstance(at, int | float):
            return None
        if not _LIMITS[0] <= factor <= _LIMITS[1] or not math.isfinite(at):
            return None
        if at > self.clock() + 60.0:  # measured in the future: a clock or a file not ours
            return None
        return float(factor), float(at)

    def recall(self, key: str) -> RememberedFactor | None:
        """The factor last remembered for ``key`` and its age (``None``: none, or nothing
        readable); never touches the disk."""
        known = self._known.get(key)
        if known is None:
            return None
        factor, at = known
        return RememberedFactor(factor, max(self.clock() - at, 0.0))

    def remember_soon(self, key: str, factor: float) -> Future[None]:
        """Keep ``factor`` for ``key`` now; the file is written on the memory's own thread (one
        write at a time, in order): what an event loop calls, so that it never waits for the
        disk."""
        entry = self._keep(key, factor)
        return self._writer.submit(self._write, key, entry)

    def remember(self, key: str, factor: float) -> None:
        """Keep ``factor`` for ``key`` (clamped to the plausible range) and write the file
        here; a failed write is logged, never raised."""
        self._write(key, self._keep(key, factor))

    def _keep(self, key: str, factor: float) -> tuple[float, float]:
        entry = (min(max(factor, _LIMITS[0]), _LIMITS[1]), self.clock())
        self._known[key] = entry
        return entry

    def _write(self, key: str, entry: tuple[float, float]) -> None:
        """Merge ``key`` into the file as it is now (another server may share it)."""
        entries = self._read()
        entries.pop(key, None)
        entries[key] = entry
        kept = {k: {"factor": f, "at": at} for k, (f, at) in list(entries.items())[-_KEPT:]}
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd, partial = tempfile.mkstemp(dir=self.path.parent, suffix=".tmp")
            with os.fdopen(fd, "w") as out:
                json.dump(kept, out)
            os.replace(partial, self.path)
        except OSError as exc:
            log.warning("cannot remember the realtime factor at %s: %s", self.path, exc)
