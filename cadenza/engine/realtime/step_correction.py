"""The online correction of the calibrated step-time model: measured over predicted time of
recent live steps, which the deadline policy and (through the engine's reports) admission
multiply every prediction by."""

from __future__ import annotations

import math
import time
from collections import deque

from cadenza.contract.step_time_model import StepTimeModel


class OnlineCorrection:
    """Measured over predicted time of recent decode steps (a ratio of sums, so the occasional
    step that carries a codec decode weighs what it costs): the last ``window`` steps, and
    none older than ``max_age_s``, so after a busy spell an idle server returns to its
    calibration instead of keeping the last load's verdict.

    Only steps dominated by decoding count (prefill rows at most as many as decodes): those
    are the steps a real-time stream lives in. The factor is clamped to
    ``[min_factor, max_factor]``.
    """

    def __init__(
        self,
        window: int = 256,
        min_factor: float = 0.5,
        max_factor: float = 4.0,
        max_age_s: float = 30.0,
    ) -> None:
        self.min_factor = min_factor
        self.max_factor = max_factor
        self.max_age_s = max_age_s
        self.window = window
        self._steps: deque[tuple[float, float, float]] = deque()  # (time, measured, predicted)
        self._measured = 0.0
        self._predicted = 0.0

    @property
    def samples(self) -> int:
        return len(self._steps)

    def factor_at(self, now: float) -> float:
        while self._steps and now - self._steps[0][0] > self.max_age_s:
            self._drop_oldest()
        if not self._steps or self._predicted <= 0:
            return 1.0
        return min(max(self._measured / self._predicted, self.min_factor), self.max_factor)

    def _drop_oldest(self) -> None:
        _, measured, predicted = self._steps.popleft()
        self._measured -= measured
        self._predicted -= predicted

    @property
    def factor(self) -> float:
        return self.factor_at(time.monotonic())

    def observe(
        self,
        model: StepTimeModel,
        tokens: int,
        decodes: int,
        context_tokens: int,
        ms: float,
        now: float | None = None,
    ) -> None:
        if decodes == 0 or tokens > 2 * decodes or not math.isfinite(ms):
            return
        predicted = model.predict_ms(tokens, context_tokens)
        if predicted > 0:
            if len(self._steps) == self.window:
                self._drop_oldest()
            self._steps.append((time.monotonic() if now is None else now, ms, predicted))
            self._measured += ms
            self._predicted += predicted
