"""Earliest-deadline-first ordering, step skipping and prefill sizing from playout clocks.

The scheduler asks three questions each step:

* **Order**: running streams by *laxity*, the time to spare before the next chunk is late:
  ``due(next undelivered frame) - now - steps_until_that_chunk_is_complete * step_time``.
  The least lax stream goes first (earliest deadline first, counting the work left).
  Sequences without a playout clock (offline token requests) sort last.
* **Skip**: when the predicted step is over its budget (``frame period / steps per frame *
  (1 - headroom)``), streams whose laxity still exceeds their jitter reserve plus one step
  sit this step out, the laxest first, until the prediction fits. They are ahead of their
  listeners; the step they skip is spent on streams that are not. Within budget too, while
  the least lax stream is about to eat into its reserve (a new stream between its small
  first chunk and its first full one, on a busy engine), streams with more than half a
  second to spare sit out, so the steps it waits for are short.
* **Prefill size**: a prefill chunk may lengthen this step to the step budget, and past it
  by as much as every decoding stream can spare beyond its playout reserve (streams well
  ahead of their listeners lend their lead: a new prompt is prefilled at once instead of a
  few rows a step, and its first chunk comes sooner), never by more than the least lax
  stream can wait, so a new stream's prompt never makes a running one late. At least
  ``min_prefill_tokens`` are allowed, so a prompt always progresses.

* **Prompt order**: prompts are prefilled by their first chunk's deadline, which is later for
  a prompt longer than the nominal one (by a multiple of its extra rows' prefill time), so a
  short prompt arriving with long ones is not kept waiting behind them.

* **Lead**: a stream at most ``max_lead_s`` ahead of its listener is enough; when every
  running stream is further ahead than that, the engine rests (:meth:`DeadlinePolicy.idle_s`)
  instead of racing ahead, and leaves the CPU to the rest of the machine (on a small CPU, the
  edge that encodes and sends the audio shares its cores). It rests until the least lax stream
  is ``lead_hysteresis_s`` below the cap, then steps back to back up to it again: steps come
  in bursts, warm, rather than one per frame after a wait (a step after a wait finds its
  caches and OpenMP threads cold and runs up to 1.5x slower on a 2-core CPU, which would also
  make the live step-time factor, and so admission, judge a busy engine by its idle steps).

Without a step-time model (calibration off) only the ordering applies.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

from cadenza.contract.step_time_model import StepTimeModel, attended_context, step_budget_s
from cadenza.engine.layouts.token_layout import TokenLayout, layout_steps_for_frames
from cadenza.engine.realtime.step_correction import OnlineCorrection
from cadenza.engine.sequence import Sequence

# A stream with this much time to spare before its next chunk is due can sit out a step that
# a stream about to eat into its playout reserve is waiting for (DeadlinePolicy._focus).
URGENT_SKIP_LAXITY_S = 0.5


class DeadlinePolicy:
    def __init__(
        self,
        layout: TokenLayout,
        *,
        frame_period_s: float,
        first_chunk_frames: int,
        chunk_frames: int,
        headroom: float,
        min_prefill_tokens: int,
        max_lead_s: float = math.inf,
        lead_hysteresis_s: float = 0.0,
        decodes_padded: bool = True,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.layout = layout
        self.decodes_padded = decodes_padded
        self.frame_period_s = frame_period_s
        self.first_chunk_frames = first_chunk_frames
        self.chunk_frames = chunk_frames
        self.headroom = headroom
        self.min_prefill_tokens = min_prefill_tokens
        self.max_lead_s = max_lead_s
        self.lead_hysteresis_s = lead_hysteresis_s
        self._resting = False
        self.clock = clock
        self.step_model: StepTimeModel | None = None
        self.correction = OnlineCorrection()

    @property
    def step_budget_s(self) -> float:
        """The longest step that keeps every stream real-time."""
        return step_budget_s(self.frame_period_s, self.layout.steps_per_frame, self.headroom)

    def predict_s(self, tokens: int, context_tokens: int) -> float | None:
        if self.step_model is None:
            return None
        ms = self.step_model.predict_ms(tokens, context_tokens) * self.correction.factor
        return ms / 1000.0

    def laxity_s(self, seq: Sequence, now_s: float, step_s: float) -> float:
        if seq.audio is None:
            return math.inf
        clock = seq.audio.playout
        size = self.first_chunk_frames if seq.frames_sent == 0 else self.chunk_frames
        chunk_end = min(seq.frames_sent + size, max(seq.target_frames, 1))
        steps_needed = layout_steps_for_frames(self.layout, chunk_end) - seq.num_generated
        steps_needed += seq.num_tokens - seq.num_computed_tokens - 1 if seq.is_prefilling else 0
        return clock.due_s(seq.frames_sent) - now_s - max(steps_needed, 0) * step_s

    def order_and_skip(self, decodes: list[Sequence]) -> tuple[list[Sequence], list[Sequence]]:
        """``decodes`` by laxity (least first), minus the streams that may skip this step;
        returns ``(kept, skipped)``."""
        now = self.clock()
        step_s = self.predict_s(len(decodes), self._context(decodes)) or self.step_budget_s
        laxity = {seq: self.laxity_s(seq, now, step_s) for seq in decodes}
        ordered = sorted(decodes, key=lambda seq: laxity[seq])
        if self.step_model is None:
            return ordered, []
        if step_s <= self.step_budget_s:
            return self._focus(ordered, laxity, step_s)
        skipped: list[Sequence] = []
        kept = list(ordered)
        for seq in reversed(ordered):
            if seq.audio is None or laxity[seq] <= seq.audio.playout.reserve_s + step_s:
                break
            kept.remove(seq)
            skipped.append(seq)
            predicted = self.predict_s(len(kept), self._context(kept))
            if predicted is not None and predicted <= self.step_budget_s:
                break
        return kept, skipped

    def _focus(
        self, ordered: list[Sequence], laxity: dict[Sequence, float], step_s: float
    ) -> tuple[list[Sequence], list[Sequence]]:
        """Within budget: when the least lax stream is about to eat into its playout reserve
        (typically a new stream between its small first chunk and its first full one), the
        streams with more than ``URGENT_SKIP_LAXITY_S`` to spare sit this step out, so the
        step that stream is waiting for is shorter. Otherwise everyone steps."""
        first = ordered[0] if ordered else None
        if first is None or first.audio is None:
            return ordered, []
        if laxity[first] > first.audio.playout.reserve_s + step_s:
            return ordered, []
        kept = [seq for seq in ordered if laxity[seq] <= URGENT_SKIP_LAXITY_S]
        skipped = [seq for seq in ordered if laxity[seq] > URGENT_SKIP_LAXITY_S]
        return kept, skipped

    def prefill_order(self, prompts: list[Sequence]) -> list[Sequence]:
        """``prompts`` (sequences prefilling or waiting to) in the order their rows are
        prefilled: earliest first-chunk deadline first, then fewest rows left (a long prompt's
        first chunk is due later, :meth:`RealtimePlan.first_chunk_due_after_s`, so shorter
        ones go ahead of it while it can still make its own deadline); sequences without a
        playout clock last, in their order."""

        def key(seq: Sequence) -> tuple[float, int]:
            if seq.audio is None:
                return (math.inf, 0)
            return (
                seq.audio.playout.due_s(seq.frames_sent),
                seq.num_tokens - seq.num_computed_tokens,
            )

        return sorted(prompts, key=key)

    def idle_s(self, running: list[Sequence]) -> float:
        """How long the engine may rest before its next step (0: step now). Resting starts
        when the least lax of ``running`` is more than ``max_lead_s`` ahead and lasts until it
        is only ``max_lead_s - lead_hysteresis_s`` ahead; in between, steps run back to back.
        Never while a stream is prefilling or has no playout clock."""
        if not running or not math.isfinite(self.max_lead_s):
            return 0.0
        if any(seq.is_prefilling or seq.audio is None for seq in running):
            self._resting = False
            return 0.0
        now = self.clock()
        step_s = self.predict_s(len(running), self._context(running)) or self.step_budget_s
        laxity = min(self.laxity_s(seq, now, step_s) for seq in running)
        resume_at = self.max_lead_s - min(self.lead_hysteresis_s, self.max_lead_s)
        if laxity > self.max_lead_s:
            self._resting = True
        elif laxity <= resume_at:
            self._resting = False
        return max(laxity - resume_at, 0.0) if self._resting else 0.0

    def prefill_limit(
        self, decodes: list[Sequence], budget_tokens: int, context_before: int = 0
    ) -> int:
        """Most prefill rows this step may carry next to ``decodes``, the first of them at
        position ``context_before`` of its prompt (a later row of a long prompt reads more
        positions): what fits the step budget, or more where every decoding stream has that
        much time to spare beyond its playout reserve (:meth:`spare_lead_s`), never more than
        the least lax can wait."""
        if self.step_model is None or not decodes:
            return budget_tokens
        now = self.clock()
        step_s = self.predict_s(len(decodes), self._context(decodes)) or 0.0
        laxity_s = min(self.laxity_s(seq, now, step_s) for seq in decodes)
        if self.step_model.prefill_ms(1, context_before) <= 0:
            return budget_tokens
        spare_s = self.step_budget_s - step_s
        if math.isfinite(laxity_s):
            lead_s = self._spare_lead_s(decodes, now, step_s)
            spare_s = max(min(spare_s, laxity_s), lead_s if lead_s is not None else 0.0)
        spare_ms = 1000.0 * max(spare_s, 0.0) / self.correction.factor
        allowed = self.step_model.prefill_rows_within(spare_ms, context_before)
        return max(min(allowed, budget_tokens), min(self.min_prefill_tokens, budget_tokens))

    def spare_lead_s(self, running: list[Sequence]) -> float | None:
        """How much longer the next step of ``running`` could take than predicted with no
        playing stream eating into its playout reserve: the least ``laxity - reserve`` among
        those that have had their first chunk, at least 0, steps taken at the step budget
        without a step model; ``None`` without playing streams. (What admission counts on
        for a new prompt: a stream still waiting for its first chunk is about to have its
        own lead; :meth:`prefill_limit` protects its first chunk step by step.)"""
        now = self.clock()
        step_s = self.predict_s(len(running), self._context(running)) or self.step_budget_s
        playing = [s for s in running if s.audio is not None and s.audio.frames_sent > 0]
        return self._spare_lead_s(playing, now, step_s)

    def _spare_lead_s(self, decodes: list[Sequence], now: float, step_s: float) -> float | None:
        spares = [
            self.laxity_s(seq, now, step_s) - seq.audio.playout.reserve_s
            for seq in decodes
            if seq.audio is not None
        ]
        return max(min(spares), 0.0) if spares else None

    def _context(self, decodes: list[Sequence]) -> int:
        """KV positions a step's decodes over ``decodes`` attend."""
        return attended_context([seq.num_tokens for seq in decodes], [], self.decodes_padded)
