"""The page pool: which KV pages are free, cached or in use, with prefix caching by hash chain.

Every page is in exactly one state::

    free    ref_count 0, no hash         on the free queue
    cached  ref_count 0, hash kept       on the free queue, and findable by its hash
    in use  ref_count > 0                referenced by that many page tables

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

PageHash = bytes


def hash_page(
    parent: PageHash | None, tokens: Sequence[Sequence[int]], extra_keys: tuple[str, ...]
) -> PageHash:
    """Hash of a full page: its parent's hash, its token rows, and the extra keys."""
    digest = hashlib.sha256()
    digest.update(parent or b"root")
    for key in extra_keys:
        digest.update(key.encode())
        digest.update(b"\x00")
    for row in tokens:
        digest.update(b"|")
        digest.update(",".join(map(str, row)).encode())
    return digest.digest()


class PagePoolExhausted(RuntimeError):
    pass


class PagePool:
    def __init__(self, num_pages: int, enable_prefix_caching: bool = True) -> None:
        self.num_pages = num_pages
        self.enable_prefix_caching = enable_prefix_caching
        self.ref_counts = [0] * num_pages
        self.page_hashes: list[PageHash | None] = [None] * num_pages
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_pages))
        self._by_hash: dict[PageHash, int] = {}

    @property
    def num_free_pages(self) -> int:
        """Pages allocation can take now (free and cached)."""
        return len(self._free)

    @property
    def num_cached_pages(self) -> int:
        """Pages with ref count 0 that still answer prefix lookups."""
        return sum(1 for page in self._free if self.page_hashes[page] is not None)

    def allocate(self, count: int) -> list[int]:
        """Take ``count`` pages (ref count 1 each). Raises :class:`PagePoolExhausted`."""
        if count > len(self._free):
            raise PagePoolExhausted(f"need {count} pages, {len(self._free)} free")
        pages = []
        for _ in range(count):
            page, _ = self._free.popitem(last=False)
            self._forget_hash(page)
            self.ref_counts[page] = 1
            pages.append(page)
        return pages

    def lookup(self, page_hash: PageHash) -> int | None:
        """The page holding the full page with this hash, if cached or in use."""
        return self._by_hash.get(page_hash) if self.enable_prefix_caching else None

    def acquire(self, page: int) -> None:
        """Add a reference to a page found by :meth:`lookup` (a prefix hit)."""
        if self.ref_counts[page] == 0:
            del self._free[page]
        self.ref_counts[page] += 1

    def release(self, pages: Iterable[int]) -> None:
        """Drop one reference from each page; pages reaching 0 join the back of the free
        queue in the order given (pass a sequence's pages tail first, so tails go first)."""
        for page in pages:
            if self.ref_counts[page] <= 0:
                raise RuntimeError(f"page {page} released more often than acquired")
            self.ref_counts[page] -= 1
            if self.ref_counts[page] == 0:
                self._free[page] = None

    def cache(self, page: int, page_hash: PageHash) -> None:
        """Record that in-use page ``page`` now holds the full page hashed ``page_hash``."""
        if not self.enable_prefix_caching or self.page_hashes[page] is not None:
            return
        if page_hash in self._by_hash:
            return  # an identical page is already cached; this copy stays private
        self.page_hashes[page] = page_hash
        self._by_hash[page_hash] = page

    def reset_prefix_cache(self) -> None:
        for page in list(self._by_hash.values()):
            self.page_hashes[page] = None
        self._by_hash.clear()

    def _forget_hash(self, page: int) -> None:
        page_hash = self.page_hashes[page]
        if page_hash is not None:
            del self._by_hash[page_hash]
            self.page_hashes[page] = None

    def check_integrity(self, page_tables: Iterable[Sequence[int]]) -> None:
        """Assert the pool's invariants against every live page table. Raises AssertionError.

        free + cached + in use == total; each page's ref count equals the number of tables
        that hold it; the free queue holds exactly the pages with ref count 0; the hash index
        and the per-page hashes agree.
        """
        expected = [0] * self.num_pages
        for table in page_tables:
            for page in table:
                expected[page] += 1
        assert expected == self.ref_counts, "ref counts differ from page-table references"
        zero = {b for b, refs in enumerate(self.ref_counts) if refs == 0}
        assert zero == set(self._free), "free queue differs from pages with ref count 0"
        in_use = self.num_pages - len(zero)
        cached = self.num_cached_pages
        free = len(self._free) - cached
        assert free + cached + in_use == self.num_pages
        for page_hash, page in self._by_hash.items():
            assert self.page_hashes[page] == page_hash, "hash index out of step"
        assert sum(h is not None for h in self.page_hashes) == len(self._by_hash)
