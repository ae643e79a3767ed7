"""What every step cost, for the edge (drained into ``stats`` reports) and for the deadline
policy's online correction.

Each non-empty step is recorded with its work (decodes, rows, attended context) and wall time;
every delivered chunk with its slack before its playout deadline; the streaming codec with its
time and stream-frames. :meth:`StepTelemetry.take_report` hands all of it over once and starts
afresh. Between reports the records are bounded, so an engine nobody drains (offline use)
keeps only the most recent ones.
"""

from __future__ import annotations

from collections import deque

from cadenza.contract.engine_stats import StepRecord, StepReport
from cadenza.contract.step_time_model import attended_context
from cadenza.engine.realtime.deadline_policy import DeadlinePolicy
from cadenza.engine.scheduler import ScheduledBatch

MAX_RECORDS = 4096


class StepTelemetry:
    def __init__(self, policy: DeadlinePolicy | None, decodes_padded: bool = True) -> None:
        """``decodes_padded``: how the engine's decode steps attend (see
        :func:`~cadenza.contract.step_time_model.attended_context`)."""
        self.policy = policy
        self.decodes_padded = decodes_padded
        self.last_step: StepRecord | None = None
        self._steps: deque[StepRecord] = deque(maxlen=MAX_RECORDS)
        self._slacks_s: deque[float] = deque(maxlen=MAX_RECORDS)
        self._codec_s = 0.0
        self._codec_frames = 0
        self._step_codec_s = 0.0  # the codec's time in the step being run

    def record_step(self, batch: ScheduledBatch, seconds: float, rested_s: float = 0.0) -> None:
        """A step that ran ``batch`` took ``seconds``, after ``rested_s`` idle (empty steps
        are not steps)."""
        if batch.is_empty:
            return
        context = attended_context(
            [seq.num_tokens for seq in batch.decodes],
            [seq.num_tokens for seq, _ in batch.prefills],
            self.decodes_padded,
        )
        codec_s, self._step_codec_s = self._step_codec_s, 0.0
        record = StepRecord(
            seconds, len(batch.decodes), batch.num_tokens, context, rested_s, codec_s
        )
        self._steps.append(record)
        self.last_step = record
        policy = self.policy
        if policy is not None and policy.step_model is not None:
            policy.correction.observe(
                policy.step_model, record.tokens, record.decodes, context, 1000.0 * seconds
            )

    def record_chunk(self, slack_s: float) -> None:
        self._slacks_s.append(slack_s)

    def record_codec(self, seconds: float, frames: int) -> None:
        """The codec decoded ``frames`` stream-frames in ``seconds``, within the step being
        run (recorded with it)."""
        self._codec_s += seconds
        self._codec_frames += frames
        self._step_codec_s += seconds

    def take_report(self) -> StepReport:
        report = StepReport(
            steps=tuple(self._steps),
            chunk_slack_s=tuple(self._slacks_s),
            codec_s=self._codec_s,
            codec_frames=self._codec_frames,
        )
        self._steps.clear()
        self._slacks_s.clear()
        self._codec_s, self._codec_frames = 0.0, 0
        return report
