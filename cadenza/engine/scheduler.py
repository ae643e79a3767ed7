"""The scheduler: which sequences advance this step and by how many tokens, and every change
to their progress once the step has run.

One rule covers prefill, chunked prefill, decode and prefix hits: bring every running
sequence's ``num_computed_tokens`` up to its ``num_tokens``, spending at most
``max_num_batched_tokens`` per step, with at most ``max_num_seqs`` sequences running.
Decoding sequences go first (one token each), so a long prompt delays running streams by at
most one chunk; then sequences still prefilling; then waiting sequences are admitted (both in
arrival order, or by first-chunk deadline with a deadline policy) while their pages (see
:class:`KVCacheManager`) and the budget allow. A prefix hit simply starts a sequence with
``num_computed_tokens > 0``::

    running   A [#######|.]        decode: 1 token          budget 8
              B [####.......]      prefill chunk: 4 tokens  (what is left: 3)
    waiting   C [..........]       admitted with 3 tokens of its prompt

With a :class:`DeadlinePolicy`, decoding streams are taken in deadline order, streams far ahead
of their listeners may skip an over-budget step, and prefill chunks are capped so that no
decoding stream becomes late (see :mod:`cadenza.engine.realtime.deadline_policy`).

If a running sequence cannot grow (only possible without output reservation), the most recently
admitted sequence is preempted: its pages are released, its tokens so far become its prompt, and
it goes back to the front of the queue to be recomputed. Preemptions are counted.

:meth:`Scheduler.postprocess` applies a step's results: computed tokens advance, sampled rows
are appended, the layout says whether each sequence is done (a restarting layout, also whether
it goes on in a fresh context: its pages are released and its new prompt is prefilled), newly
full pages are published to the prefix cache, and finished or failed sequences give back their
pages.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from cadenza.contract.request import FinishReason
from cadenza.engine.kv.kv_cache_manager import KVCacheManager
from cadenza.engine.layouts.token_layout import ContextRestarts, TokenLayout
from cadenza.engine.realtime.deadline_policy import DeadlinePolicy
from cadenza.engine.sequence import Sequence, SequenceStatus


@dataclass
class ScheduledBatch:
    """One step's work: decodes first (one token each), then prefill chunks."""

    decodes: list[Sequence] = field(default_factory=list)
    prefills: list[tuple[Sequence, int]] = field(default_factory=list)
    skipped: list[Sequence] = field(default_factory=list)  # ahead of playout, sat this one out

    @property
    def num_tokens(self) -> int:
        return len(self.decodes) + sum(n for _, n in self.prefills)

    @property
    def is_empty(self) -> bool:
        return not self.decodes and not self.prefills

    def items(self) -> list[tuple[Sequence, int]]:
        return [(seq, 1) for seq in self.decodes] + self.prefills


@dataclass
class StepResult:
    """What a forward pass produced: a row for each sequence that sampled, and the
    sequences that failed (with the reason); the model runner builds it."""

    rows: list[tuple[Sequence, list[int]]] = field(default_factory=list)
    failed: list[tuple[Sequence, str]] = field(default_factory=list)


@dataclass
class StepOutcome:
    """What :meth:`Scheduler.postprocess` did: the sequences that got a row, those that
    finished (already out of the schedule, pages released) and those that failed."""

    sampled: list[Sequence] = field(default_factory=list)
    finished: dict[Sequence, FinishReason] = field(default_factory=dict)
    failed: dict[Sequence, str] = field(default_factory=dict)


class Scheduler:
    def __init__(
        self,
        kv: KVCacheManager,
        layout: TokenLayout,
        max_num_batched_tokens: int,
        max_num_seqs: int,
        policy: DeadlinePolicy | None = None,
    ) -> None:
        if max_num_batched_tokens < max_num_seqs:
            raise ValueError("max_num_batched_tokens must be at least max_num_seqs")
        self.kv = kv
        self.layout = layout
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_num_seqs = max_num_seqs
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_preemptions = 0
        self.policy = policy
        self.num_skipped = 0  # sequence-steps skipped because the stream was ahead
        self.restarts = layout if isinstance(layout, ContextRestarts) else None

    def add(self, seq: Sequence) -> None:
        seq.status = SequenceStatus.WAITING
        self.waiting.append(seq)

    def schedule(self) -> ScheduledBatch:
        batch = ScheduledBatch()
        budget = self.max_num_batched_tokens
        decoding = [seq for seq in self.running if not seq.is_prefilling]
        prefilling = [seq for seq in self.running if seq.is_prefilling]
        if self.policy is not None:
            decoding, batch.skipped = self.policy.order_and_skip(decoding)
            self.num_skipped += len(batch.skipped)
        for seq in decoding:
            if budget == 0:
                break
            if seq.status is not SequenceStatus.RUNNING:
                continue  # preempted earlier in this loop
            if self._grow(seq, 1, batch):
                batch.decodes.append(seq)
                budget -= 1
        if self.policy is not None:
            # Prompts by first-chunk deadline (a short prompt's is sooner than a long one's)
            prefilling = self.policy.prefill_order(prefilling)
            self.waiting = deque(self.policy.prefill_order(list(self.waiting)))
            # The next prompt rows continue the first prefilling sequence (or start a new one)
            before = prefilling[0].num_computed_tokens if prefilling else 0
            budget = self.policy.prefill_limit(batch.decodes, budget, before)
        for seq in prefilling:
            if budget == 0:
                break
            if seq.status is not SequenceStatus.RUNNING:
                continue
            num_new = min(seq.num_tokens - seq.num_computed_tokens, budget)
            if self._grow(seq, num_new, batch):
                batch.prefills.append((seq, num_new))
                budget -= num_new
        while self.waiting and len(self.running) < self.max_num_seqs and budget > 0:
            seq = self.waiting[0]
            if not self.kv.try_admit(seq):
                break
            num_new = min(seq.num_tokens - seq.num_computed_tokens, budget)
            if not self.kv.allocate_slots(seq, num_new):
                self.kv.free(seq)
                break
            self.waiting.popleft()
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            batch.prefills.append((seq, num_new))
            budget -= num_new
        return batch

    def postprocess(self, batch: ScheduledBatch, result: StepResult) -> StepOutcome:
        """Apply one step's ``result`` to the sequences of ``batch`` (the only place that
        changes their progress after a forward pass)."""
        outcome = StepOutcome()
        for seq, error in result.failed:
            if seq.status is not SequenceStatus.RUNNING:
                continue  # ended while its step was in flight (an overlapped step's abort)
            self.finish(seq, FinishReason.ERROR, error)
            outcome.failed[seq] = error
        for seq, num_new in batch.items():
            if seq.status is SequenceStatus.RUNNING:
                seq.num_computed_tokens += num_new
        for seq, row in result.rows:
            if seq.status is not SequenceStatus.RUNNING:
                continue
            seq.append(row)
            seq.end_frame, reason = self.layout.on_row(seq, row)
            if reason is None and seq.num_generated >= seq.max_new_steps:
                reason = FinishReason.LENGTH
            outcome.sampled.append(seq)
            if reason is not None:
                outcome.finished[seq] = reason
            elif self.restarts is not None and (rows := self.restarts.next_context(seq)):
                self.kv.release_context(seq)
                seq.begin_context(rows)
        for seq, reason in outcome.finished.items():
            self.finish(seq, reason)
        for seq, _ in batch.items():
            if seq.status is SequenceStatus.RUNNING:
                self.kv.cache_full_pages(seq)
        return outcome

    def finish(self, seq: Sequence, reason: FinishReason, error: str | None = None) -> None:
        """Drop a finished (or aborted, or failed) sequence and release its pages."""
        if seq.status is SequenceStatus.RUNNING:
            self.running.remove(seq)
            self.kv.free(seq)
        elif seq.status is SequenceStatus.WAITING:
            self.waiting.remove(seq)
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason, seq.error = reason, error

    def check_integrity(self) -> None:
        """Assert pages, reservations and the queues agree (``AssertionError``)."""
        self.kv.check_integrity(self.running, list(self.waiting))
        assert all(s.status is SequenceStatus.RUNNING for s in self.running)
        assert all(s.status is SequenceStatus.WAITING for s in self.waiting)

    def _grow(self, seq: Sequence, num_new: int, batch: ScheduledBatch) -> bool:
        """Allocate for ``seq``, preempting the newest running sequences not already in
        ``batch`` while needed (decodes go in deadline order, so the newest may be in it).
        ``False`` if ``seq`` itself had to be preempted."""
        scheduled = {id(s) for s, _ in batch.items()}
        while not self.kv.allocate_slots(seq, num_new):
            victim = next(s for s in reversed(self.running) if s is seq or id(s) not in scheduled)
            self._preempt(victim)
            if victim is seq:
                return False
        return True

    def _preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self.kv.free(seq)
        seq.status = SequenceStatus.WAITING
        seq.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(seq)
