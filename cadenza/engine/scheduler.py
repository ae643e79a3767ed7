"""The scheduler: which sequences advance this step, and by how many tokens.

One rule covers prefill, chunked prefill, decode and prefix hits: bring every running
sequence's ``num_computed_tokens`` up to its ``num_tokens``, spending at most
``max_num_batched_tokens`` per step, with at most ``max_num_seqs`` sequences running.
Decoding sequences go first (one token each), so a long prompt delays running streams by at
most one chunk; then sequences still prefilling; then waiting sequences are admitted in arrival
order while their pages (see :class:`KVCacheManager`) and the budget allow. A prefix hit simply
starts a sequence with ``num_computed_tokens > 0``.

With a :class:`DeadlinePolicy`, decoding streams are taken in deadline order, streams far ahead
of their listeners may skip an over-budget step, and prefill chunks are capped so that no
decoding stream becomes late (see :mod:`cadenza.engine.deadline_policy`).

If a running sequence cannot grow (only possible without output reservation), the most recently
admitted sequence is preempted: its pages are released, its tokens so far become its prompt, and
it goes back to the front of the queue to be recomputed. Preemptions are counted.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from cadenza.engine.deadline_policy import DeadlinePolicy
from cadenza.engine.kv_cache_manager import KVCacheManager
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


class Scheduler:
    def __init__(
        self,
        kv: KVCacheManager,
        max_num_batched_tokens: int,
        max_num_seqs: int,
        policy: DeadlinePolicy | None = None,
    ) -> None:
        if max_num_batched_tokens < max_num_seqs:
            raise ValueError("max_num_batched_tokens must be at least max_num_seqs")
        self.kv = kv
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_num_seqs = max_num_seqs
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_preemptions = 0
        self.policy = policy
        self.num_skipped = 0  # sequence-steps skipped because the stream was ahead

    def add(self, seq: Sequence) -> None:
        seq.status = SequenceStatus.WAITING
        self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

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
            if self._grow(seq, 1):
                batch.decodes.append(seq)
                budget -= 1
        if self.policy is not None:
            budget = self.policy.prefill_limit(batch.decodes, budget)
        for seq in prefilling:
            if budget == 0:
                break
            if seq.status is not SequenceStatus.RUNNING:
                continue
            num_new = min(seq.num_tokens - seq.num_computed_tokens, budget)
            if self._grow(seq, num_new):
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

    def finish(self, seq: Sequence) -> None:
        """Drop a finished (or aborted, or failed) sequence and release its pages."""
        if seq.status is SequenceStatus.RUNNING:
            self.running.remove(seq)
            self.kv.free(seq)
        elif seq.status is SequenceStatus.WAITING:
            self.waiting.remove(seq)
        seq.status = SequenceStatus.FINISHED

    def _grow(self, seq: Sequence, num_new: int) -> bool:
        """Allocate for ``seq``, preempting the newest running sequences while needed.
        ``False`` if ``seq`` itself had to be preempted."""
        while not self.kv.allocate_slots(seq, num_new):
            victim = self.running[-1]
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

    def block_tables(self) -> list[list[int]]:
        return [seq.block_table for seq in self.running]
