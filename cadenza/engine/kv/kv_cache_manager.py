"""Pages for sequences: prefix matching, reservation at admission, growth, release.

Reservation: when ``reserve_max_output`` is on (the default), a sequence is admitted only if
the pool can also hold everything it may still generate (``prompt + max_new_steps`` tokens,
:func:`~cadenza.contract.kv_memory.pages_for_tokens`), counting what every running sequence
has reserved but not yet taken. Pages are still taken lazily, a step at a time, so unused
reservations keep cached prefixes alive; but a running sequence never finds the pool empty,
and preemption cannot happen. With it off, admission only checks the prompt, and a full pool
makes the scheduler preempt (recompute) the newest sequence.

Prefix matching walks the prompt's full pages through the hash chain and stops at the first
miss. It never covers the last prompt token, so a hit still leaves one token to compute: the
forward that produces the first sampled token::

    token_rows  [ p0 .. p15 | p16 .. p31 | p32 .. p40 ]      page_size 16, 41 prompt tokens
    pages        hit          hit          computed          (at most (41 - 1) // 16 hits)

Placement: a sequence's own pages (after its prefix hits) are taken as one run of neighbouring
pages where the pool has one free (:meth:`PagePool.allocate_run` claims the whole reservation,
:meth:`PagePool.extend_run` continues it as the sequence grows), so a decode step reads each
sequence's keys in order rather than scattered over the cache.

This class is the only writer of a sequence's ``page_table``, ``page_hashes``,
``reserved_pages`` and ``prefix_pages``.
"""

from __future__ import annotations

from cadenza.contract.kv_memory import pages_for_tokens
from cadenza.engine.kv.page_pool import PagePool, hash_page
from cadenza.engine.sequence import Sequence


class KVCacheManager:
    def __init__(self, pool: PagePool, page_size: int, reserve_max_output: bool = True) -> None:
        self.pool = pool
        self.page_size = page_size
        self.reserve_max_output = reserve_max_output
        self.outstanding_pages = 0  # reserved by running sequences, not yet allocated
        self.prefix_hit_tokens = 0
        self.prefix_query_tokens = 0

    def reservation(self, seq: Sequence) -> int:
        """Pages ``seq`` may need in all: its tokens so far plus what it may still generate."""
        remaining_steps = max(seq.max_new_steps - seq.num_generated, 0)
        tokens = seq.num_tokens + remaining_steps
        if seq.max_context is not None:  # a restarting layout's contexts never grow past it
            tokens = min(tokens, seq.max_context)
        return pages_for_tokens(tokens, self.page_size)

    def try_admit(self, seq: Sequence) -> bool:
        """Give a waiting ``seq`` its cached prefix and its reservation, if the pool allows.

        On success ``seq.page_table`` holds the hit pages and ``num_computed_tokens`` covers
        them; on failure nothing changes.
        """
        hits = self._match_prefix(seq)
        free_hits = sum(1 for page in hits if self.pool.ref_counts[page] == 0)
        if self.reserve_max_output:
            needed = self.reservation(seq) - len(hits)
            budget = self.pool.num_free_pages - free_hits - self.outstanding_pages
        else:
            needed = pages_for_tokens(seq.num_tokens, self.page_size) - len(hits)
            budget = self.pool.num_free_pages - free_hits
        if needed > budget:
            return False
        for page in hits:
            self.pool.acquire(page)
        seq.page_table = list(hits)
        seq.prefix_pages = len(hits)
        seq.page_hashes = [self.pool.page_hashes[p] for p in hits]  # type: ignore[misc]
        seq.num_computed_tokens = len(hits) * self.page_size
        if self.reserve_max_output:
            seq.reserved_pages = needed + len(hits)
            self.outstanding_pages += needed
        self.prefix_query_tokens += seq.num_tokens
        self.prefix_hit_tokens += seq.num_computed_tokens
        return True

    def allocate_slots(self, seq: Sequence, num_new_tokens: int) -> bool:
        """Make room for ``num_new_tokens`` more cached tokens; ``False`` if the pool is full."""
        needed = pages_for_tokens(seq.num_computed_tokens + num_new_tokens, self.page_size)
        needed -= len(seq.page_table)
        if needed <= 0:
            return True
        if needed > self.pool.num_free_pages:
            return False
        if self.reserve_max_output:
            # Pages inside the reservation stop being outstanding once they are taken.
            self.outstanding_pages -= min(needed, self._unallocated(seq))
        # What the sequence may still take: its reservation, or at least these pages.
        span = max(seq.reserved_pages - len(seq.page_table), needed)
        if len(seq.page_table) > seq.prefix_pages:
            pages = self.pool.extend_run(seq.page_table[-1], needed, span)
        else:
            pages = self.pool.allocate_run(needed, span)
        seq.page_table.extend(pages)
        return True

    def cache_full_pages(self, seq: Sequence) -> None:
        """Hash and publish every page of ``seq`` that became full and computed."""
        if not self.pool.enable_prefix_caching:
            return
        num_full = seq.num_computed_tokens // self.page_size
        size = self.page_size
        while len(seq.page_hashes) < num_full:
            index = len(seq.page_hashes)
            parent = seq.page_hashes[-1] if seq.page_hashes else None
            rows = seq.token_rows[index * size : (index + 1) * size]
            page_hash = hash_page(parent, rows, seq.extra_keys)
            seq.page_hashes.append(page_hash)
            self.pool.cache(seq.page_table[index], page_hash)

    def release_context(self, seq: Sequence) -> None:
        """Give back ``seq``'s pages but keep its reservation: its next context (a fresh
        prompt from position 0) takes pages again within it. Pages published to the prefix
        cache stay cached."""
        before = self._unallocated(seq)
        self.pool.release(reversed(seq.page_table))
        seq.page_table = []
        seq.page_hashes = []
        seq.prefix_pages = 0
        seq.num_computed_tokens = 0
        self.outstanding_pages += self._unallocated(seq) - before

    def free(self, seq: Sequence) -> None:
        """Release ``seq``'s pages (tail first, so tails are evicted first) and reservation."""
        self.pool.release(reversed(seq.page_table))
        self.outstanding_pages -= self._unallocated(seq)
        seq.reserved_pages = 0
        seq.prefix_pages = 0
        seq.page_table = []
        seq.page_hashes = []
        seq.num_computed_tokens = 0

    def check_integrity(self, running: list[Sequence], waiting: list[Sequence]) -> None:
        """Assert pages and reservations agree with the sequences (``AssertionError``)."""
        self.pool.check_integrity(seq.page_table for seq in running)
        assert all(not seq.page_table for seq in waiting), "a waiting sequence holds pages"
        for seq in running:
            assert len(seq.page_table) * self.page_size >= seq.num_computed_tokens
        outstanding = sum(self._unallocated(seq) for seq in running)
        assert outstanding == self.outstanding_pages, "reservation ledger is off"
        assert outstanding <= self.pool.num_free_pages, "reservations exceed free pages"

    @staticmethod
    def _unallocated(seq: Sequence) -> int:
        return max(seq.reserved_pages - len(seq.page_table), 0)

    def _match_prefix(self, seq: Sequence) -> list[int]:
        if not self.pool.enable_prefix_caching:
            return []
        size = self.page_size
        max_pages = (seq.num_tokens - 1) // size  # the last token is always computed
        hits: list[int] = []
        parent = None
        for index in range(max_pages):
            rows = seq.token_rows[index * size : (index + 1) * size]
            parent = hash_page(parent, rows, seq.extra_keys)
            page = self.pool.lookup(parent)
            if page is None:
                break
            hits.append(page)
        return hits
