"""Pages for sequences: prefix matching, reservation at admission, growth, release.

Reservation: when ``reserve_max_output`` is on (the default), a sequence is admitted only if
the pool can also hold everything it may still generate (``prompt + max_new_steps`` tokens),
counting what every running sequence has reserved but not yet taken. Pages are still taken
lazily, a step at a time, so unused reservations keep cached prefixes alive; but a running
sequence never finds the pool empty, and preemption cannot happen. With it off, admission only
checks the prompt, and a full pool makes the scheduler preempt (recompute) the newest sequence.

Prefix matching walks the prompt's full blocks through the hash chain and stops at the first
miss. It never covers the last prompt token, so a hit still leaves one token to compute: the
forward that produces the first sampled token.
"""

from __future__ import annotations

from cadenza.engine.block_pool import BlockPool, hash_block
from cadenza.engine.sequence import Sequence


class KVCacheManager:
    def __init__(self, pool: BlockPool, block_size: int, reserve_max_output: bool = True) -> None:
        self.pool = pool
        self.block_size = block_size
        self.reserve_max_output = reserve_max_output
        self.outstanding_blocks = 0  # reserved by running sequences, not yet allocated
        self.prefix_hit_tokens = 0
        self.prefix_query_tokens = 0

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def reservation(self, seq: Sequence) -> int:
        """Pages ``seq`` may need in all: its tokens so far plus what it may still generate."""
        remaining_steps = max(seq.max_new_steps - seq.num_generated, 0)
        return self.blocks_for(seq.num_tokens + remaining_steps)

    def try_admit(self, seq: Sequence) -> bool:
        """Give a waiting ``seq`` its cached prefix and its reservation, if the pool allows.

        On success ``seq.block_table`` holds the hit pages and ``num_computed_tokens`` covers
        them; on failure nothing changes.
        """
        hits = self._match_prefix(seq)
        free_hits = sum(1 for block in hits if self.pool.ref_counts[block] == 0)
        if self.reserve_max_output:
            needed = self.reservation(seq) - len(hits)
            budget = self.pool.num_free_blocks - free_hits - self.outstanding_blocks
        else:
            needed = self.blocks_for(seq.num_tokens) - len(hits)
            budget = self.pool.num_free_blocks - free_hits
        if needed > budget:
            return False
        for block in hits:
            self.pool.acquire(block)
        seq.block_table = list(hits)
        seq.block_hashes = [self.pool.block_hashes[b] for b in hits]  # type: ignore[misc]
        seq.num_computed_tokens = len(hits) * self.block_size
        if self.reserve_max_output:
            seq.reserved_blocks = needed + len(hits)
            self.outstanding_blocks += needed
        self.prefix_query_tokens += seq.num_tokens
        self.prefix_hit_tokens += seq.num_computed_tokens
        return True

    def allocate_slots(self, seq: Sequence, num_new_tokens: int) -> bool:
        """Make room for ``num_new_tokens`` more cached tokens; ``False`` if the pool is full."""
        needed = self.blocks_for(seq.num_computed_tokens + num_new_tokens) - len(seq.block_table)
        if needed <= 0:
            return True
        if needed > self.pool.num_free_blocks:
            return False
        if self.reserve_max_output:
            # Pages inside the reservation stop being outstanding once they are taken.
            self.outstanding_blocks -= min(needed, self._unallocated(seq))
        seq.block_table.extend(self.pool.allocate(needed))
        return True

    def cache_full_blocks(self, seq: Sequence) -> None:
        """Hash and publish every block of ``seq`` that became full and computed."""
        if not self.pool.enable_prefix_caching:
            return
        num_full = seq.num_computed_tokens // self.block_size
        size = self.block_size
        while len(seq.block_hashes) < num_full:
            index = len(seq.block_hashes)
            parent = seq.block_hashes[-1] if seq.block_hashes else None
            rows = seq.token_rows[index * size : (index + 1) * size]
            block_hash = hash_block(parent, rows, seq.extra_keys)
            seq.block_hashes.append(block_hash)
            self.pool.cache(seq.block_table[index], block_hash)

    def free(self, seq: Sequence) -> None:
        """Release ``seq``'s pages (tail first, so tails are evicted first) and reservation."""
        self.pool.release(reversed(seq.block_table))
        self.outstanding_blocks -= self._unallocated(seq)
        seq.reserved_blocks = 0
        seq.block_table = []
        seq.block_hashes = []
        seq.num_computed_tokens = 0

    @staticmethod
    def _unallocated(seq: Sequence) -> int:
        return max(seq.reserved_blocks - len(seq.block_table), 0)

    def _match_prefix(self, seq: Sequence) -> list[int]:
        if not self.pool.enable_prefix_caching:
            return []
        size = self.block_size
        max_blocks = (seq.num_tokens - 1) // size  # the last token is always computed
        hits: list[int] = []
        parent = None
        for index in range(max_blocks):
            rows = seq.token_rows[index * size : (index + 1) * size]
            parent = hash_block(parent, rows, seq.extra_keys)
            block = self.pool.lookup(parent)
            if block is None:
                break
            hits.append(block)
        return hits
