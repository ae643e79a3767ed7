"""When to restart a lost engine, and when to stop trying.

A lost engine (it crashed, hung, or failed to start) is restarted after a wait that starts at
``supervision.restart_backoff_s`` and doubles with every loss in a row, up to
``supervision.restart_backoff_max_s``. A loss continues the streak when the engine never became
ready or was lost within ``STABLE_AFTER_S`` of becoming ready; an engine that served longer
than that was not crash-looping, and its replacement starts at once (after the first wait).

Giving up is for a model that cannot *start*: after ``supervision.max_start_failures`` starts in a
row that never reached ready (a bad checkpoint, a device that is gone) the model is taken to be
broken, no more restarts, and :attr:`RestartPolicy.gave_up` says why. An engine that becomes
ready and is then killed, however often, is always restarted.
"""

from __future__ import annotations

from cadenza.config import SupervisionConfig

STABLE_AFTER_S = 10.0  # an engine up this long before it was lost was not crash-looping


class RestartPolicy:
    def __init__(self, config: SupervisionConfig) -> None:
        self.backoff_s = config.restart_backoff_s
        self.backoff_max_s = config.restart_backoff_max_s
        self.max_start_failures = config.max_start_failures
        self.losses_in_a_row = 0
        self.start_failures_in_a_row = 0
        self.gave_up: str | None = None
        self._ready_at: float | None = None

    def on_ready(self, now: float) -> None:
        """The engine became ready at ``now`` (monotonic seconds)."""
        self._ready_at = now
        self.start_failures_in_a_row = 0

    def on_lost(self, now: float, reason: str) -> float | None:
        """The engine was lost (or failed to start) at ``now`` because of ``reason``: seconds
        to wait before starting it again, or ``None`` to give up (see :attr:`gave_up`)."""
        was_ready = self._ready_at is not None
        stable = self._ready_at is not None and now - self._ready_at >= STABLE_AFTER_S
        self._ready_at = None
        self.losses_in_a_row = 1 if stable else self.losses_in_a_row + 1
        if not was_ready:
            self.start_failures_in_a_row += 1
        if self.start_failures_in_a_row >= self.max_start_failures:
            self.gave_up = (
                f"engine failed to start {self.start_failures_in_a_row} times in a row, "
                f"not restarting; last: {reason}"
            )
            return None
        return min(self.backoff_s * 2 ** (self.losses_in_a_row - 1), self.backoff_max_s)
