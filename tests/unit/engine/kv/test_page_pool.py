"""Block pool and KV cache manager: states, LRU eviction, hash chains, and random operation
sequences that must keep every invariant."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cadenza.engine.kv import page_pool
from cadenza.engine.kv.page_pool import PagePool, PagePoolExhausted, hash_page


def test_allocate_release_and_reuse_order():
    pool = PagePool(4)
    first = pool.allocate(3)
    assert first == [0, 1, 2] and pool.num_free_pages == 1
    pool.release(reversed(first))  # tail first
    assert pool.allocate(1) == [3]  # least recently freed goes first
    assert pool.allocate(1) == [2]
    with pytest.raises(PagePoolExhausted):
        pool.allocate(5)
    pool.check_integrity([[3], [2]])


def test_cached_pages_are_found_until_evicted():
    pool = PagePool(2)
    (page,) = pool.allocate(1)
    key = hash_page(None, [[1], [2]], ("m",))
    pool.cache(page, key)
    pool.release([page])
    assert pool.num_cached_pages == 1 and pool.lookup(key) == page
    pool.acquire(page)  # a prefix hit revives it
    assert pool.ref_counts[page] == 1 and pool.num_free_pages == 1
    pool.release([page])
    pool.allocate(2)  # reuse evicts the hash
    assert pool.lookup(key) is None
    pool.check_integrity([[0], [1]])


def test_hash_chain_depends_on_parent_tokens_and_extra_keys():
    base = hash_page(None, [[1, 2]], ("model", "float32", "voice=a"))
    assert base == hash_page(None, [[1, 2]], ("model", "float32", "voice=a"))
    assert base != hash_page(None, [[1, 2]], ("model", "float32", "voice=b"))
    assert base != hash_page(None, [[2, 1]], ("model", "float32", "voice=a"))
    assert hash_page(base, [[3]], ()) != hash_page(None, [[3]], ())
    assert hash_page(None, [[1, 23]], ()) != hash_page(None, [[12, 3]], ())


def test_double_release_is_caught():
    pool = PagePool(2)
    (page,) = pool.allocate(1)
    pool.release([page])
    with pytest.raises(RuntimeError):
        pool.release([page])


def test_prefix_caching_off_never_hits():
    pool = PagePool(2, enable_prefix_caching=False)
    (page,) = pool.allocate(1)
    key = hash_page(None, [[1]], ())
    pool.cache(page, key)
    assert pool.lookup(key) is None


def test_a_run_claims_its_span_and_the_next_run_starts_after_it():
    pool = PagePool(16)
    first = pool.allocate_run(2, span=5)
    second = pool.allocate_run(1, span=3)
    assert first == [0, 1] and second == [5]  # pages 2-4 stay claimed for the first
    assert pool.num_free_pages == 13  # a claim is not a use
    assert pool.extend_run(first[-1], 3, span=3) == [2, 3, 4]
    pool.check_integrity([[0, 1, 2, 3, 4], [5]])


def test_a_run_that_cannot_continue_starts_another():
    pool = PagePool(16)
    first = pool.allocate_run(1, span=1)  # claims page 0 only
    other = pool.allocate(1)  # the free queue's front: page 1, unclaimed
    assert other == [1]
    more = pool.extend_run(first[-1], 2, span=2)
    assert more == [2, 3]  # page 1 is taken: a new run of two
    pool.check_integrity([[0, 2, 3], [1]])


def test_claims_end_with_the_runs_first_page():
    pool = PagePool(8)
    run = pool.allocate_run(2, span=4)
    pool.release(reversed(run))
    pool.check_integrity([])  # no claim left behind
    assert pool.allocate_run(1, span=4) == [4]  # next fit: after the last run's span
    pool.check_integrity([[4]])


def test_runs_leave_pages_a_prefix_hit_revived_in_the_free_queue():
    pool = PagePool(8)
    key = hash_page(None, [[7]], ())
    (cached,) = pool.allocate(1)
    assert cached == 0
    pool.cache(cached, key)
    pool.release([cached])
    page = pool.lookup(key)
    assert page is not None
    pool.acquire(page)  # a prefix hit revives it: a popular prefix
    pool.release([page])
    assert pool.allocate_run(2, span=2) == [1, 2]
    assert pool.lookup(key) == cached  # still cached
    pool.check_integrity([[1, 2]])


def test_no_free_run_falls_back_to_the_free_queue():
    pool = PagePool(6)
    tables = [pool.allocate(1) for _ in range(3)]  # pages 0, 1, 2
    pool.release(tables[1])  # free: 3, 4, 5, then 1 - no run of four
    pages = pool.allocate_run(2, span=4)
    assert pages == [3, 4]  # the free queue's front
    assert pool.num_free_pages == 2
    with pytest.raises(PagePoolExhausted):
        pool.allocate_run(3, span=3)
    with pytest.raises(PagePoolExhausted):
        pool.extend_run(pages[-1], 3, span=3)


def test_a_run_search_is_bounded_and_the_next_one_looks_further_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(page_pool, "RUN_SEARCH_PAGES", 4)
    pool = PagePool(16)
    pool.allocate(4)  # pages 0-3 in use: the first four pages hold no run
    assert pool.allocate_run(1, span=2) == [4]  # the free queue's front
    assert pool.allocate_run(1, span=2) == [5]  # searched from page 4 on: a run of 5-6
    assert pool.extend_run(5, 1, span=1) == [6]
    pool.check_integrity([[0], [1], [2], [3], [4], [5, 6]])


operations = st.lists(
    st.tuples(
        st.sampled_from(["alloc", "run", "extend", "release", "cache", "hit"]), st.integers(0, 7)
    ),
    max_size=60,
)


@settings(max_examples=200, deadline=None)
@given(operations)
def test_random_operations_keep_the_invariants(ops):
    pool = PagePool(8)
    tables: list[list[int]] = []
    for op, arg in ops:
        if op == "alloc" and arg <= pool.num_free_pages:
            tables.append(pool.allocate(arg))
        elif op == "run" and 0 < arg <= pool.num_free_pages:
            tables.append(pool.allocate_run(arg, span=arg + arg % 3))
        elif op == "extend" and tables and tables[arg % len(tables)] and pool.num_free_pages:
            table = tables[arg % len(tables)]
            table += pool.extend_run(table[-1], 1, span=1 + arg % 4)
        elif op == "release" and tables:
            pool.release(reversed(tables.pop(arg % len(tables))))
        elif op == "cache" and tables and tables[arg % len(tables)]:
            table = tables[arg % len(tables)]
            pool.cache(table[0], hash_page(None, [[arg]], ()))
        elif op == "hit":
            page = pool.lookup(hash_page(None, [[arg]], ()))
            if page is not None:
                pool.acquire(page)
                tables.append([page])
        pool.check_integrity(tables)
    for table in tables:
        pool.release(table)
    pool.check_integrity([])
    assert pool.num_free_pages == 8
