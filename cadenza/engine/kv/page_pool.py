"""The page pool: which KV pages are free, cached or in use, with prefix caching by hash chain.

Every page is in exactly one state::

    free    ref_count 0, no hash         on the free queue
    cached  ref_count 0, hash kept       on the free queue, and findable by its hash
    in use  ref_count > 0                referenced by that many page tables

The free queue is least-recently-freed first: allocation takes from its front (evicting the
hash of a cached page it reuses), release appends to its back, and a prefix hit pulls a cached
page out of the middle. Only *full* pages get a hash, so shared pages are never written again.

*Runs*: a sequence's pages are best next to each other in memory. A decode step reads every
running sequence's keys and values page by page; pages scattered over the cache cost the CPU's
fused step 1.3-1.5x the time of the same positions in order (the hardware prefetcher loses the
stream at every page; docs/journal/2026-12-03-kv-pages-in-runs.md), and after a few minutes of
churn the least-recently-freed queue is in random order. :meth:`PagePool.allocate_run` claims a
free run of pages for a sequence's whole reservation (next fit from where the last run ended)
and takes its first ones; :meth:`PagePool.extend_run` takes the pages right after a
sequence's last one as it grows. A claim is only a placement hint: claimed pages stay free
(counted, and taken by plain :meth:`allocate` when nothing else is left), and a run that cannot
be found or continued falls back to the free queue. A run never takes a page a prefix hit has
revived (it stays in least-recently-freed order, so popular prefixes survive); other cached
pages a run passes over lose their hash.

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


RUN_SEARCH_PAGES = 4096
"""The most pages one run search looks at (0.13 ms of Python on the 2-core development
machine, where a 95 %-full pool holds no run)."""


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
        # Runs: each page's claim (its run's first page + 1; 0 unclaimed), each run's end, the
        # pages prefix hits revived (runs leave them alone), where the next run search starts.
        self._claim = [0] * num_pages
        self._run_ends: dict[int, int] = {}
        self._revived = bytearray(num_pages)
        self._cursor = 0

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

    def allocate_run(self, count: int, span: int) -> list[int]:
        """Take ``count`` pages for a sequence that may grow to ``span`` pages in all: the first
        ``count`` of a free run of ``span`` pages, the rest of which stays claimed for
        :meth:`extend_run`; from the free queue where no such run is free. Raises
        :class:`PagePoolExhausted`."""
        if count > len(self._free):
            raise PagePoolExhausted(f"need {count} pages, {len(self._free)} free")
        span = max(span, count)
        start = self._find_run(span) if count > 0 else None
        if start is None:
            return self.allocate(count)
        claim = start + 1
        self._claim[start : start + span] = [claim] * span
        self._run_ends[start] = start + span
        self._cursor = (start + span) % self.num_pages
        return [self._take(page) for page in range(start, start + count)]

    def extend_run(self, last: int, count: int, span: int) -> list[int]:
        """Take ``count`` pages for a sequence whose last page is ``last``: the pages right
        after it while they are free and unclaimed or claimed by ``last``'s run, then a new run
        (:meth:`allocate_run`, ``span``: the pages the sequence may still take) for the rest.
        Raises :class:`PagePoolExhausted`."""
        if count > len(self._free):
            raise PagePoolExhausted(f"need {count} pages, {len(self._free)} free")
        pages: list[int] = []
        owner = self._claim[last]
        page = last + 1
        while len(pages) < count and page < self.num_pages and self._continues(page, owner):
            pages.append(self._take(page))
            page += 1
        if len(pages) < count:
            pages += self.allocate_run(count - len(pages), span - len(pages))
        return pages

    def _continues(self, page: int, owner: int) -> bool:
        """Whether a run whose claim is ``owner`` may take ``page`` next."""
        return (
            self.ref_counts[page] == 0
            and self._claim[page] in (0, owner)
            and not self._revived[page]
        )

    def _find_run(self, span: int) -> int | None:
        """The first page of ``span`` free, unclaimed pages no prefix hit revived, looking at
        no more than :data:`RUN_SEARCH_PAGES` pages (or once round the pool) from the cursor
        (next fit); ``None`` if there is none there. The search runs on the engine's step:
        bounded, a crowded pool costs a scattered sequence, never a stalled step; the cursor
        moves on, so the next search looks elsewhere."""
        n = self.num_pages
        if span > n:
            return None
        length = 0
        page = self._cursor
        for _ in range(min(n + span, RUN_SEARCH_PAGES)):
            if page == n:  # a run does not wrap round the end
                page, length = 0, 0
            if self.ref_counts[page] == 0 and not self._claim[page] and not self._revived[page]:
                length += 1
                if length == span:
                    return page - span + 1
            else:
                length = 0
            page += 1
        self._cursor = page % n
        return None

    def _take(self, page: int) -> int:
        """Move free ``page`` out of the free queue into use (ref count 1), forgetting its
        hash."""
        del self._free[page]
        self._forget_hash(page)
        self.ref_counts[page] = 1
        return page

    def lookup(self, page_hash: PageHash) -> int | None:
        """The page holding the full page with this hash, if cached or in use."""
        return self._by_hash.get(page_hash) if self.enable_prefix_caching else None

    def acquire(self, page: int) -> None:
        """Add a reference to a page found by :meth:`lookup` (a prefix hit)."""
        if self.ref_counts[page] == 0:
            del self._free[page]
            self._revived[page] = 1
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
                self._end_run(page)

    def _end_run(self, page: int) -> None:
        """Drop the claim of the run starting at ``page``, if one does (its sequence has let
        go of its first page: it is done)."""
        end = self._run_ends.pop(page, None)
        if end is None:
            return
        claim = page + 1
        for index in range(page, end):
            if self._claim[index] == claim:
                self._claim[index] = 0

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
        self._revived = bytearray(self.num_pages)

    def _forget_hash(self, page: int) -> None:
        self._revived[page] = 0
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
        for start, end in self._run_ends.items():
            assert self.ref_counts[start] > 0, "a run outlived its first page"
            assert start < end <= self.num_pages
        for page, claim in enumerate(self._claim):
            if claim:
                start = claim - 1
                assert start <= page < self._run_ends.get(start, -1), "a stale run claim"
