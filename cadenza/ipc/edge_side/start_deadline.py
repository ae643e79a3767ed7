"""When the edge gives up on an engine that is starting: once it has made no progress for
``supervision.startup_timeout_s``, not after a fixed time.

A starting engine says every second what it is doing and how much CPU time its process has
used (``starting`` messages). Loading takes seconds; a calibration takes a minute on a quiet
machine and several times that beside a busy neighbour (each sweep's steps run slower, and a
sweep that contradicts itself is measured again): a fixed deadline long enough for the worst
case would leave a hung engine undetected for as long. So the deadline moves with progress:
a new stage, or CPU time that grew, puts it ``timeout_s`` ahead again. An engine that is
silent, or that reports without using the CPU (blocked, deadlocked), runs out of it.
"""

from __future__ import annotations

from cadenza.contract.messages import Starting

MIN_PROGRESS_CPU_S = 0.05  # CPU time that counts as work done since the last report


class StartDeadline:
    """``timeout_s`` without progress, from ``now`` (the engine's start)."""

    def __init__(self, timeout_s: float, now: float) -> None:
        self.timeout_s = timeout_s
        self.stage = "starting"
        self._progress_at = now
        self._cpu_s = 0.0

    def observe(self, report: Starting, now: float) -> bool:
        """Fold in one report; ``True`` when it shows progress (the deadline moved)."""
        progressed = report.stage != self.stage or report.cpu_s >= self._cpu_s + MIN_PROGRESS_CPU_S
        self.stage = report.stage
        if progressed:
            self._progress_at = now
            self._cpu_s = max(self._cpu_s, report.cpu_s)
        return progressed

    def expired(self, now: float) -> bool:
        return now - self._progress_at > self.timeout_s

    def reason(self) -> str:
        """Why the engine is given up on."""
        return (
            f"engine did not become ready in time: no progress for {self.timeout_s:g} s "
            f"(last stage: {self.stage})"
        )
