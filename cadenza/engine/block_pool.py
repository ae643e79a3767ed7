"""The block pool: which KV pages are free, cached or in use, with prefix caching by hash chain.

Every page is in exactly one state::

    free    ref_count 0, no hash         on the free queue
    cached  ref_count 0, hash kept       on the free queue, and findable by its hash
    in use  ref_count > 0                referenced by that many block tables

The free queue is least-recently-freed first: allocation takes from its front (evicting the
hash of a cached page it reuses), release appends to its back, and a prefix hit pulls a cached
page out of the middle. Only *full* pages get a hash, so shared pages are never written again.

A page's hash chains its parent's hash, its tokens and the extra keys (model, KV dtype,
conditioning) through SHA-256: equal hashes mean equal prefixes under equal conditions.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Iterable, Sequence

BlockHash = bytes


def hash_block(
    parent: BlockHash | None, tokens: Sequence[Sequence[int]], extra_keys: tuple[str, ...]
) -> BlockHash:
    """Hash of a full block: its parent's hash, its token rows, and the extra keys."""
    digest = hashlib.sha256()
    digest.update(parent or b"root")
    for key in extra_keys:
        digest.update(key.encode())
        digest.update(b"\x00")
    for row in tokens:
        digest.update(b"|")
        digest.update(",".join(map(str, row)).encode())
    return digest.digest()


class BlockPoolExhausted(RuntimeError):
    pass


class BlockPool:
    def __init__(self, num_blocks: int, enable_prefix_caching: bool = True) -> None:
        self.num_blocks = num_blocks
        self.enable_prefix_caching = enable_prefix_caching
        self.ref_counts = [0] * num_blocks
        self.block_hashes: list[BlockHash | None] = [None] * num_blocks
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self._by_hash: dict[BlockHash, int] = {}

    @property
    def num_free_blocks(self) -> int:
        """Pages allocation can take now (free and cached)."""
        return len(self._free)

    @property
    def num_cached_blocks(self) -> int:
        """Pages with ref count 0 that still answer prefix lookups."""
        return sum(1 for block in self._free if self.block_hashes[block] is not None)

    def allocate(self, count: int) -> list[int]:
        """Take ``count`` pages (ref count 1 each). Raises :class:`BlockPoolExhausted`."""
        if count > len(self._free):
            raise BlockPoolExhausted(f"need {count} blocks, {len(self._free)} free")
        blocks = []
        for _ in range(count):
            block, _ = self._free.popitem(last=False)
            self._forget_hash(block)
            self.ref_counts[block] = 1
            blocks.append(block)
        return blocks

    def lookup(self, block_hash: BlockHash) -> int | None:
        """The page holding this full block, if cached or in use."""
        return self._by_hash.get(block_hash) if self.enable_prefix_caching else None

    def acquire(self, block: int) -> None:
        """Add a reference to a page found by :meth:`lookup` (a prefix hit)."""
        if self.ref_counts[block] == 0:
            del self._free[block]
        self.ref_counts[block] += 1

    def release(self, blocks: Iterable[int]) -> None:
        """Drop one reference from each page; pages reaching 0 join the back of the free
        queue in the order given (pass a sequence's pages tail first, so tails go first)."""
        for block in blocks:
            if self.ref_counts[block] <= 0:
                raise RuntimeError(f"block {block} released more often than acquired")
            self.ref_counts[block] -= 1
            if self.ref_counts[block] == 0:
                self._free[block] = None

    def cache(self, block: int, block_hash: BlockHash) -> None:
        """Record that in-use page ``block`` now holds the full block ``block_hash``."""
        if not self.enable_prefix_caching or self.block_hashes[block] is not None:
            return
        if block_hash in self._by_hash:
            return  # an identical block is already cached; this copy stays private
        self.block_hashes[block] = block_hash
        self._by_hash[block_hash] = block

    def reset_prefix_cache(self) -> None:
        for block in list(self._by_hash.values()):
            self.block_hashes[block] = None
        self._by_hash.clear()

    def _forget_hash(self, block: int) -> None:
        block_hash = self.block_hashes[block]
        if block_hash is not None:
            del self._by_hash[block_hash]
            self.block_hashes[block] = None

    def check_integrity(self, block_tables: Iterable[Sequence[int]]) -> None:
        """Assert the pool's invariants against every live block table. Raises AssertionError.

        free + cached + in use == total; each page's ref count equals the number of tables
        that hold it; the free queue holds exactly the pages with ref count 0; the hash index
        and the per-page hashes agree.
        """
        expected = [0] * self.num_blocks
        for table in block_tables:
            for block in table:
                expected[block] += 1
        assert expected == self.ref_counts, "ref counts differ from block-table references"
        zero = {b for b, refs in enumerate(self.ref_counts) if refs == 0}
        assert zero == set(self._free), "free queue differs from pages with ref count 0"
        in_use = self.num_blocks - len(zero)
        cached = self.num_cached_blocks
        free = len(self._free) - cached
        assert free + cached + in_use == self.num_blocks
        for block_hash, block in self._by_hash.items():
            assert self.block_hashes[block] == block_hash, "hash index out of step"
        assert sum(h is not None for h in self.block_hashes) == len(self._by_hash)
