"""How many real-time streams this server can hold, from measured memory and measured steps.

Two budgets, both from the engine (its ``ready`` info and its ``stats`` reports):

* **KV memory**: the engine's page pool (``KV_budget`` already net of weights, see
  ``engine.kv_cache_memory_*``). A stream needs pages for its prompt and its maximum output
  (``pages(prompt tokens + steps for max duration)``); admission keeps the sum over admitted
  streams within the pool, so the engine never has to preempt.
* **Real time**: one codec frame every ``1 / frame_rate`` seconds per stream, i.e. a step of at
  most ``frame period / steps_per_frame * (1 - headroom)``. The calibrated step-time model
  (scaled by the engine's online correction) says how many decoding streams fit that step.
  A stream is admitted only if ``B + 1`` streams still fit.

``max_streams`` is the smaller of the two for a *nominal* stream (``admission.nominal_stream_s``
of audio, at its full context), capped by the engine's ``max_num_seqs``.
If delivered chunks start arriving with less slack than ``admission.slack_close_ms`` before
their deadline, admission closes (no new stream until slack has recovered for
``admission.slack_reopen_s``): the measurement wins over the model. An idle server always
admits one stream, however slow its steps look: no one else can be hurt by it.

No torch here: this runs in the edge.
"""

from __future__ import annotations

import math
import statistics
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from cadenza.config import AdmissionConfig, EngineConfig
from cadenza.engine.messages import EngineInfo
from cadenza.engine.step_time_model import StepTimeModel

PROMPT_OVERHEAD_TOKENS = 16  # voice / begin-of-audio / special rows around the text


@dataclass(frozen=True)
class StreamCost:
    """What one admitted stream holds: KV pages reserved, seconds of audio it may produce."""

    kv_pages: int
    audio_s: float


class CapacityModel:
    def __init__(
        self,
        info: EngineInfo,
        engine: EngineConfig,
        admission: AdmissionConfig,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.info = info
        self.engine_config = engine
        self.config = admission
        self.clock = clock
        calibration = info.calibration
        self.step_model = (
            StepTimeModel.from_dict(calibration["model"]) if calibration is not None else None
        )
        self.correction = 1.0
        self.kv_pages_free = info.kv_blocks_total
        self._recent_steps: deque[float] = deque(maxlen=512)  # ms of steps with decodes
        self._closed_until = 0.0
        self.min_recent_slack_ms: float | None = None

    # -- inputs -------------------------------------------------------------------------------

    def observe(self, stats: dict[str, Any]) -> None:
        """Fold one engine ``stats`` message in."""
        engine = stats["engine"]
        self.correction = float(engine.get("step_correction", 1.0))
        self.kv_pages_free = int(engine["kv_blocks_free"])
        for seconds, decodes in zip(stats["step_s"], stats["step_decodes"], strict=False):
            if decodes > 0:
                self._recent_steps.append(1000.0 * seconds)
        slacks = stats.get("chunk_slack_ms") or []
        self.min_recent_slack_ms = min(slacks) if slacks else None
        if slacks and min(slacks) < self.config.slack_close_ms:
            self._closed_until = self.clock() + self.config.slack_reopen_s

    # -- the numbers ----------------------------------------------------------------------------

    @property
    def frame_period_ms(self) -> float:
        return 1000.0 / self.info.frame_rate

    @property
    def step_budget_ms(self) -> float:
        headroom = self.engine_config.realtime_headroom
        return self.frame_period_ms / self.info.steps_per_frame * (1.0 - headroom)

    @property
    def nominal_context_tokens(self) -> int:
        """Context each nominal stream costs a decode step: a full nominal stream (prompt plus
        all its output steps), since a step pads every stream's keys to the batch's longest,
        and with streams at every stage the longest is nearly done."""
        steps = self.config.nominal_stream_s * self.info.frame_rate * self.info.steps_per_frame
        return int(64 + steps)

    def stream_cost(self, text: str, audio_s: float, prompt_audio_s: float = 0.0) -> StreamCost:
        """A conservative estimate of what a request holds (the engine's own reservation is
        exact; it is never larger than this for byte- or subword-tokenized text)."""
        frames = math.ceil(audio_s * self.info.frame_rate)
        prompt = len(text.encode("utf-8")) + PROMPT_OVERHEAD_TOKENS
        prompt += math.ceil(prompt_audio_s * self.info.frame_rate) * self.info.steps_per_frame
        steps = (frames + 8) * self.info.steps_per_frame  # + delay-pattern tail
        return StreamCost(math.ceil((prompt + steps) / self.info.block_size), audio_s)

    def realtime_limit(self) -> int:
        """Decoding streams whose step fits the real-time budget (``max_num_seqs`` without a
        calibration)."""
        limit = self.info.max_num_seqs
        if self.step_model is None:
            return limit
        budget = self.step_budget_ms / max(self.correction, 1e-6)
        return self.step_model.max_batch(budget, self.nominal_context_tokens, limit)

    def kv_limit(self) -> int:
        nominal = self.stream_cost("x" * 64, self.config.nominal_stream_s)
        return self.info.kv_blocks_total // max(nominal.kv_pages, 1)

    def max_streams(self) -> int:
        return max(min(self.realtime_limit(), self.kv_limit(), self.info.max_num_seqs), 0)

    @property
    def admission_open(self) -> bool:
        return self.clock() >= self._closed_until

    def refusal(self, active: int, reserved_pages: int, cost: StreamCost) -> str | None:
        """Why one more stream cannot start now (``None``: it can)."""
        if active > 0 and not self.admission_open:
            return "deadlines_slipping"
        if active > 0 and active + 1 > self.realtime_limit():
            return "realtime_budget"
        if active + 1 > self.info.max_num_seqs:
            return "max_streams"
        if reserved_pages + cost.kv_pages > self.info.kv_blocks_total:
            return "kv_memory"
        return None

    def step_ms_p50(self, active: int) -> float:
        """Median of recent steps that decoded; the model's prediction before any."""
        if self._recent_steps:
            return statistics.median(self._recent_steps)
        if self.step_model is None:
            return 0.0
        streams = max(active, 1)
        predicted = self.step_model.predict_ms(streams, streams * self.nominal_context_tokens)
        return predicted * self.correction

    def rtf_headroom(self, active: int) -> float:
        """``1 - step time / step budget at zero headroom``: the share of real time still free
        (negative: the engine is slower than real time)."""
        step_ms = self.step_ms_p50(active)
        return 1.0 - step_ms * self.info.steps_per_frame / self.frame_period_ms
