"""KV cache manager: reservation, admission, growth, prefix pages, release, integrity check."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from cadenza.contract.sampling import SamplingParams
from cadenza.engine.kv.kv_cache_manager import KVCacheManager
from cadenza.engine.kv.page_pool import PagePool, hash_page
from cadenza.engine.sequence import Sequence

PAGE = 4
KEYS = ("model", "float32")


def make_seq(rows: list[list[int]], max_new_steps: int = 4, keys=KEYS) -> Sequence:
    return Sequence(
        "s", [list(r) for r in rows], SamplingParams(), torch.Generator(), max_new_steps, keys
    )


def tokens(n: int, start: int = 0) -> list[list[int]]:
    return [[start + i] for i in range(n)]


def manager(num_pages: int = 8, *, reserve: bool = True, prefix: bool = True) -> KVCacheManager:
    return KVCacheManager(PagePool(num_pages, prefix), PAGE, reserve_max_output=reserve)


def compute(kv: KVCacheManager, seq: Sequence, num_new: int) -> None:
    """What a scheduled step does to ``seq``'s pages: grow, compute, publish."""
    assert kv.allocate_slots(seq, num_new)
    seq.num_computed_tokens += num_new
    kv.cache_full_pages(seq)


def snapshot(kv: KVCacheManager, seq: Sequence) -> tuple:
    pool = kv.pool
    return (
        kv.outstanding_pages,
        kv.prefix_hit_tokens,
        kv.prefix_query_tokens,
        list(pool.ref_counts),
        list(pool.page_hashes),
        pool.num_free_pages,
        pool.num_cached_pages,
        list(seq.page_table),
        list(seq.page_hashes),
        seq.reserved_pages,
        seq.num_computed_tokens,
    )


# -- reservation ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("prompt", "max_new", "generated", "pages"),
    [
        (5, 10, 0, 4),  # 15 tokens
        (5, 11, 0, 4),  # 16 tokens: exactly four pages
        (5, 12, 0, 5),  # 17 tokens
        (5, 10, 3, 4),  # tokens so far (8) + what is left (7): the same total
        (5, 2, 6, 3),  # generated past max_new_steps: only what it has (11 tokens)
        (1, 0, 0, 1),
    ],
)
def test_reservation_is_pages_for_tokens_so_far_plus_remaining_steps(
    prompt, max_new, generated, pages
) -> None:
    seq = make_seq(tokens(prompt), max_new)
    for _ in range(generated):
        seq.append([0])
    assert manager().reservation(seq) == pages


# -- admission ------------------------------------------------------------------------------


def test_try_admit_reserves_the_whole_output_and_takes_no_page_yet() -> None:
    kv = manager(8)
    seq = make_seq(tokens(5), max_new_steps=10)  # 15 tokens: 4 pages
    assert kv.try_admit(seq)
    assert seq.page_table == [] and seq.num_computed_tokens == 0
    assert seq.reserved_pages == 4 and kv.outstanding_pages == 4
    assert kv.pool.num_free_pages == 8  # reserved, not taken
    assert kv.prefix_query_tokens == 5 and kv.prefix_hit_tokens == 0
    kv.check_integrity([seq], [])


def test_a_refused_admission_changes_nothing() -> None:
    kv = manager(4)
    first = make_seq(tokens(9), max_new_steps=3)  # 12 tokens: 3 pages
    assert kv.try_admit(first)
    compute(kv, first, 9)  # two full pages published
    kv.free(first)  # now cached, free
    assert kv.pool.num_cached_pages == 2

    greedy = make_seq(tokens(9), max_new_steps=20)  # 29 tokens: 8 pages, with 2 hits
    before = snapshot(kv, greedy)
    assert not kv.try_admit(greedy)
    assert snapshot(kv, greedy) == before
    assert kv.pool.num_cached_pages == 2  # its would-be hits stay cached and free
    kv.check_integrity([], [greedy])


def test_admission_counts_what_running_sequences_reserved_but_did_not_take() -> None:
    kv = manager(6)
    a = make_seq(tokens(2), max_new_steps=10)  # 12 tokens: 3 pages
    b = make_seq(tokens(2, 50), max_new_steps=10)
    c = make_seq(tokens(1, 90), max_new_steps=1)  # 1 page
    assert kv.try_admit(a) and kv.try_admit(b)
    assert kv.pool.num_free_pages == 6 and kv.outstanding_pages == 6
    assert not kv.try_admit(c)  # every free page is promised
    kv.free(b)
    assert kv.try_admit(c)
    kv.check_integrity([a, c], [])


def test_without_reservation_admission_checks_only_the_prompt() -> None:
    kv = manager(2, reserve=False)
    seq = make_seq(tokens(8), max_new_steps=100)
    assert kv.try_admit(seq)
    assert seq.reserved_pages == 0 and kv.outstanding_pages == 0
    too_long = make_seq(tokens(9), max_new_steps=0)
    assert not kv.try_admit(too_long)


def test_a_prefix_hit_on_cached_free_pages_counts_them_against_the_budget() -> None:
    kv = manager(4)
    first = make_seq([[5]] * 9, max_new_steps=3)
    assert kv.try_admit(first)
    compute(kv, first, 9)
    hit_pages = first.page_table[:2]
    kv.free(first)

    second = make_seq([[5]] * 9, max_new_steps=3)  # 12 tokens: 3 pages, 2 of them hits
    assert kv.try_admit(second)
    assert second.page_table == hit_pages
    assert second.page_hashes == [kv.pool.page_hashes[p] for p in hit_pages]
    assert second.num_computed_tokens == 8
    assert second.reserved_pages == 3 and kv.outstanding_pages == 1
    assert [kv.pool.ref_counts[p] for p in hit_pages] == [1, 1]
    assert kv.pool.num_free_pages == 2
    assert (kv.prefix_hit_tokens, kv.prefix_query_tokens) == (8, 18)
    kv.check_integrity([second], [])


def test_a_prefix_hit_on_pages_in_use_shares_them() -> None:
    kv = manager(8)
    first = make_seq([[5]] * 9)
    assert kv.try_admit(first)
    compute(kv, first, 9)
    second = make_seq([[5]] * 9)
    assert kv.try_admit(second)
    assert second.page_table == first.page_table[:2]
    assert [kv.pool.ref_counts[p] for p in second.page_table] == [2, 2]
    kv.check_integrity([first, second], [])


# -- prefix matching ----------------------------------------------------------------------


@pytest.mark.parametrize(("prompt", "hits"), [(4, 0), (5, 1), (8, 1), (9, 2), (12, 2), (13, 3)])
def test_prefix_matching_never_covers_the_last_prompt_token(prompt, hits) -> None:
    kv = manager(16)
    donor = make_seq([[5]] * 16, max_new_steps=1)
    assert kv.try_admit(donor)
    compute(kv, donor, 16)  # four full pages cached
    seq = make_seq([[5]] * prompt, max_new_steps=1)
    assert kv.try_admit(seq)
    assert len(seq.page_table) == hits
    assert seq.num_computed_tokens == hits * PAGE < prompt


def test_prefix_matching_stops_at_the_first_miss() -> None:
    kv = manager(16)
    donor = make_seq(tokens(13), max_new_steps=1)
    assert kv.try_admit(donor)
    compute(kv, donor, 13)
    rows = tokens(13)
    rows[5] = [99]  # the second page differs
    seq = make_seq(rows, max_new_steps=1)
    assert kv.try_admit(seq)
    assert seq.page_table == donor.page_table[:1]  # the third page is equal but unreachable


def test_prefix_matching_needs_equal_extra_keys() -> None:
    kv = manager(16)
    donor = make_seq(tokens(9), max_new_steps=1, keys=("m", "voice=a"))
    assert kv.try_admit(donor)
    compute(kv, donor, 9)
    other = make_seq(tokens(9), max_new_steps=1, keys=("m", "voice=b"))
    assert kv.try_admit(other) and other.page_table == []
    same = make_seq(tokens(9), max_new_steps=1, keys=("m", "voice=a"))
    assert kv.try_admit(same) and len(same.page_table) == 2


# -- growth ---------------------------------------------------------------------------------


def test_allocate_slots_grows_by_whole_pages_and_draws_down_the_reservation() -> None:
    kv = manager(8)
    seq = make_seq(tokens(5), max_new_steps=10)  # 4 pages reserved
    assert kv.try_admit(seq)
    assert kv.allocate_slots(seq, 5)
    assert len(seq.page_table) == 2 and kv.outstanding_pages == 2
    seq.num_computed_tokens = 5
    assert kv.allocate_slots(seq, 3)  # 8 tokens still fit in two pages
    assert len(seq.page_table) == 2 and kv.outstanding_pages == 2
    assert kv.allocate_slots(seq, 4)  # 9 tokens: a third page
    assert len(seq.page_table) == 3 and kv.outstanding_pages == 1
    assert kv.pool.num_free_pages == 5
    kv.check_integrity([seq], [])


def test_allocate_slots_past_the_reservation_leaves_the_ledger_at_zero() -> None:
    kv = manager(8)
    seq = make_seq(tokens(3), max_new_steps=1)  # 4 tokens: 1 page reserved
    assert kv.try_admit(seq)
    assert kv.allocate_slots(seq, 9)  # 3 pages: 2 beyond the reservation
    assert len(seq.page_table) == 3 and kv.outstanding_pages == 0
    kv.check_integrity([seq], [])


def test_allocate_slots_fails_without_change_when_the_pool_is_short() -> None:
    kv = manager(3, reserve=False)
    seq = make_seq(tokens(4), max_new_steps=8)
    assert kv.try_admit(seq)
    before = snapshot(kv, seq)
    assert not kv.allocate_slots(seq, 13)  # 4 pages
    assert snapshot(kv, seq) == before
    assert kv.allocate_slots(seq, 12)
    assert kv.pool.num_free_pages == 0


def test_sequences_growing_side_by_side_keep_their_pages_in_runs() -> None:
    kv = manager(32)
    first = make_seq(tokens(5), max_new_steps=11)  # 16 tokens: a run of four pages
    second = make_seq(tokens(5, start=100), max_new_steps=11)
    assert kv.try_admit(first) and kv.try_admit(second)
    compute(kv, first, 5)
    compute(kv, second, 5)
    for _ in range(11):  # decode steps, one token each, in turn
        compute(kv, first, 1)
        compute(kv, second, 1)
    assert first.page_table == [0, 1, 2, 3]
    assert second.page_table == [4, 5, 6, 7]
    kv.check_integrity([first, second], [])


def test_a_sequences_own_pages_after_its_prefix_hits_are_one_run() -> None:
    kv = manager(32)
    donor = make_seq(tokens(9), max_new_steps=0)
    assert kv.try_admit(donor)
    compute(kv, donor, 9)
    kv.free(donor)  # pages 0 and 1 stay cached
    seq = make_seq(tokens(9), max_new_steps=7)
    assert kv.try_admit(seq)
    assert seq.page_table == [0, 1] and seq.prefix_pages == 2
    compute(kv, seq, 1)
    for _ in range(7):
        compute(kv, seq, 1)
    own = seq.page_table[2:]
    assert len(own) == 2 and own[1] == own[0] + 1
    kv.check_integrity([seq], [])
    kv.free(seq)
    assert seq.prefix_pages == 0
    kv.check_integrity([], [])


# -- publishing full pages ------------------------------------------------------------------


def test_cache_full_pages_publishes_only_full_computed_pages() -> None:
    kv = manager(8)
    seq = make_seq(tokens(10), max_new_steps=2)
    assert kv.try_admit(seq)
    assert kv.allocate_slots(seq, 6)
    seq.num_computed_tokens = 6  # page 1 holds prompt tokens, but only 2 are computed
    kv.cache_full_pages(seq)
    first = hash_page(None, seq.token_rows[0:4], KEYS)
    assert seq.page_hashes == [first]
    assert kv.pool.lookup(first) == seq.page_table[0]
    assert kv.pool.page_hashes[seq.page_table[1]] is None

    compute(kv, seq, 4)  # 10 computed: the second page is full
    second = hash_page(first, seq.token_rows[4:8], KEYS)  # chained to its parent
    assert seq.page_hashes == [first, second]
    assert kv.pool.lookup(second) == seq.page_table[1]
    assert kv.pool.page_hashes[seq.page_table[2]] is None
    kv.check_integrity([seq], [])


def test_an_identical_page_already_cached_keeps_the_new_copy_private() -> None:
    kv = manager(8)
    a, b = make_seq([[5]] * 4), make_seq([[5]] * 4)
    assert kv.try_admit(a) and kv.try_admit(b)  # no hit: the last token is never covered
    compute(kv, a, 4)
    compute(kv, b, 4)
    assert a.page_hashes == b.page_hashes
    assert kv.pool.lookup(a.page_hashes[0]) == a.page_table[0]
    assert kv.pool.page_hashes[b.page_table[0]] is None
    kv.check_integrity([a, b], [])


def test_cache_full_pages_does_nothing_with_prefix_caching_off() -> None:
    kv = manager(8, prefix=False)
    seq = make_seq(tokens(9))
    assert kv.try_admit(seq)
    compute(kv, seq, 9)
    assert seq.page_hashes == [] and kv.pool.num_cached_pages == 0


# -- release --------------------------------------------------------------------------------


def test_free_releases_the_tail_first_and_clears_the_reservation() -> None:
    kv = manager(3)
    seq = make_seq(tokens(9), max_new_steps=3)
    assert kv.try_admit(seq)
    compute(kv, seq, 9)
    table = list(seq.page_table)
    assert len(table) == 3 and kv.outstanding_pages == 0
    kv.free(seq)
    assert seq.page_table == [] and seq.page_hashes == []
    assert seq.reserved_pages == 0 and seq.num_computed_tokens == 0
    assert kv.pool.allocate(3) == table[::-1]  # the tail is evicted first


def test_free_returns_unused_reservation_to_the_ledger() -> None:
    kv = manager(8)
    a, b = make_seq(tokens(2), max_new_steps=10), make_seq(tokens(2, 50), max_new_steps=5)
    assert kv.try_admit(a) and kv.try_admit(b)
    compute(kv, a, 2)
    assert kv.outstanding_pages == 2 + 2
    kv.free(a)
    assert kv.outstanding_pages == 2
    kv.check_integrity([b], [a])


def test_free_keeps_shared_pages_for_the_other_holder() -> None:
    kv = manager(8)
    a = make_seq([[5]] * 9)
    assert kv.try_admit(a)
    compute(kv, a, 9)
    b = make_seq([[5]] * 9)
    assert kv.try_admit(b)
    kv.free(a)
    assert [kv.pool.ref_counts[p] for p in b.page_table] == [1, 1]
    kv.check_integrity([b], [a])


# -- integrity ------------------------------------------------------------------------------


def _running_pair() -> tuple[KVCacheManager, Sequence, Sequence]:
    kv = manager(8)
    a, b = make_seq(tokens(5), max_new_steps=6), make_seq(tokens(3, 50), max_new_steps=2)
    assert kv.try_admit(a) and kv.try_admit(b)
    compute(kv, a, 5)
    compute(kv, b, 3)
    kv.check_integrity([a, b], [])
    return kv, a, b


@pytest.mark.parametrize("delta", [1, -1])
def test_check_integrity_catches_a_tampered_reservation_ledger(delta) -> None:
    kv, a, b = _running_pair()
    kv.outstanding_pages += delta
    with pytest.raises(AssertionError, match="ledger"):
        kv.check_integrity([a, b], [])


def test_check_integrity_catches_reservations_beyond_the_free_pages() -> None:
    kv, a, b = _running_pair()
    a.reserved_pages += 10
    kv.outstanding_pages += 10
    with pytest.raises(AssertionError, match="exceed"):
        kv.check_integrity([a, b], [])


def test_check_integrity_catches_a_waiting_sequence_with_pages() -> None:
    kv, a, b = _running_pair()
    with pytest.raises(AssertionError):
        kv.check_integrity([a], [b])


def test_check_integrity_catches_computed_tokens_without_pages() -> None:
    kv, a, b = _running_pair()
    a.num_computed_tokens = 9  # two pages hold at most 8
    with pytest.raises(AssertionError):
        kv.check_integrity([a, b], [])


def test_check_integrity_catches_a_page_missing_from_a_table() -> None:
    kv, a, b = _running_pair()
    a.page_table.pop()
    with pytest.raises(AssertionError):
        kv.check_integrity([a, b], [])


# -- random operations ----------------------------------------------------------------------

kv_operation = st.tuples(
    st.sampled_from(["admit", "grow", "free"]),
    st.integers(0, 3),  # which sequence
    st.integers(1, 6),  # prompt length / tokens to grow
    st.integers(0, 6),  # max_new_steps
)


@settings(max_examples=80, deadline=None)
@given(ops=st.lists(kv_operation, min_size=5, max_size=40), reserve=st.booleans())
def test_random_admit_grow_free_keeps_the_ledger_exact(ops, reserve) -> None:
    kv = manager(6, reserve=reserve)
    running: dict[int, Sequence] = {}
    for op, slot, n, max_new in ops:
        if op == "admit" and slot not in running:
            seq = make_seq([[5]] * n, max_new_steps=max_new)  # equal rows: prefix hits
            before = snapshot(kv, seq)
            if kv.try_admit(seq):
                running[slot] = seq
            else:
                assert snapshot(kv, seq) == before
        elif op == "grow" and slot in running:
            seq = running[slot]
            num_new = min(n, seq.num_tokens - seq.num_computed_tokens)
            if num_new == 0 and seq.num_generated < seq.max_new_steps:
                seq.append([5])  # a sampled row: one more token to compute
                num_new = 1
            if num_new and kv.allocate_slots(seq, num_new):
                seq.num_computed_tokens += num_new
                kv.cache_full_pages(seq)
        elif op == "free" and slot in running:
            kv.free(running.pop(slot))
        kv.check_integrity(list(running.values()), [])
    for seq in running.values():
        kv.free(seq)
    kv.check_integrity([], [])
    assert kv.outstanding_pages == 0 and kv.pool.num_free_pages == 6
