"""Block pool and KV cache manager: states, LRU eviction, hash chains, and random operation
sequences that must keep every invariant."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cadenza.engine.block_pool import BlockPool, BlockPoolExhausted, hash_block


def test_allocate_release_and_reuse_order():
    pool = BlockPool(4)
    first = pool.allocate(3)
    assert first == [0, 1, 2] and pool.num_free_blocks == 1
    pool.release(reversed(first))  # tail first
    assert pool.allocate(1) == [3]  # least recently freed goes first
    assert pool.allocate(1) == [2]
    with pytest.raises(BlockPoolExhausted):
        pool.allocate(5)
    pool.check_integrity([[3], [2]])


def test_cached_blocks_are_found_until_evicted():
    pool = BlockPool(2)
    (block,) = pool.allocate(1)
    key = hash_block(None, [[1], [2]], ("m",))
    pool.cache(block, key)
    pool.release([block])
    assert pool.num_cached_blocks == 1 and pool.lookup(key) == block
    pool.acquire(block)  # a prefix hit revives it
    assert pool.ref_counts[block] == 1 and pool.num_free_blocks == 1
    pool.release([block])
    pool.allocate(2)  # reuse evicts the hash
    assert pool.lookup(key) is None
    pool.check_integrity([[0], [1]])


def test_hash_chain_depends_on_parent_tokens_and_extra_keys():
    base = hash_block(None, [[1, 2]], ("model", "float32", "voice=a"))
    assert base == hash_block(None, [[1, 2]], ("model", "float32", "voice=a"))
    assert base != hash_block(None, [[1, 2]], ("model", "float32", "voice=b"))
    assert base != hash_block(None, [[2, 1]], ("model", "float32", "voice=a"))
    assert hash_block(base, [[3]], ()) != hash_block(None, [[3]], ())
    assert hash_block(None, [[1, 23]], ()) != hash_block(None, [[12, 3]], ())


def test_double_release_is_caught():
    pool = BlockPool(2)
    (block,) = pool.allocate(1)
    pool.release([block])
    with pytest.raises(RuntimeError):
        pool.release([block])


def test_prefix_caching_off_never_hits():
    pool = BlockPool(2, enable_prefix_caching=False)
    (block,) = pool.allocate(1)
    key = hash_block(None, [[1]], ())
    pool.cache(block, key)
    assert pool.lookup(key) is None


operations = st.lists(
    st.tuples(st.sampled_from(["alloc", "release", "cache", "hit"]), st.integers(0, 7)),
    max_size=60,
)


@settings(max_examples=200, deadline=None)
@given(operations)
def test_random_operations_keep_the_invariants(ops):
    pool = BlockPool(8)
    tables: list[list[int]] = []
    for op, arg in ops:
        if op == "alloc" and arg <= pool.num_free_blocks:
            tables.append(pool.allocate(arg))
        elif op == "release" and tables:
            pool.release(reversed(tables.pop(arg % len(tables))))
        elif op == "cache" and tables and tables[arg % len(tables)]:
            table = tables[arg % len(tables)]
            pool.cache(table[0], hash_block(None, [[arg]], ()))
        elif op == "hit":
            block = pool.lookup(hash_block(None, [[arg]], ()))
            if block is not None:
                pool.acquire(block)
                tables.append([block])
        pool.check_integrity(tables)
    for table in tables:
        pool.release(table)
    pool.check_integrity([])
    assert pool.num_free_blocks == 8
