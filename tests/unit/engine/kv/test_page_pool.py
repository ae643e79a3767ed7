"""Block pool and KV cache manager: states, LRU eviction, hash chains, and random operation
sequences that must keep every invariant."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

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


operations = st.lists(
    st.tuples(st.sampled_from(["alloc", "release", "cache", "hit"]), st.integers(0, 7)),
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
