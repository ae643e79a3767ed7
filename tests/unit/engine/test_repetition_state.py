"""The seen-id table: a stream's row made from its token rows, marked by what it draws, made
again when its rows are replaced (a restarted context), grown past its first rows, and freed
with the stream."""

from __future__ import annotations

import torch

from cadenza.contract.sampling import SamplingParams
from cadenza.engine.repetition_state import RepetitionState
from cadenza.engine.sequence import Sequence

CPU = torch.device("cpu")
PENALIZED = SamplingParams(temperature=0.0, repetition_penalty=1.3)


def _seq(name: str, rows: list[list[int]]) -> Sequence:
    return Sequence(name, rows, PENALIZED, torch.Generator(), 10)


def _expected(rows: list[list[int]], vocab: int) -> torch.Tensor:
    seen = torch.zeros(len(rows[0]), vocab, dtype=torch.bool)
    for row in rows:
        for codebook, token in enumerate(row):
            if 0 <= token < vocab:
                seen[codebook, token] = True
    return seen


def test_a_row_is_the_stream_s_ids_and_then_what_it_draws() -> None:
    state = RepetitionState(CPU)
    a, b = _seq("a", [[1, 2], [3, 99]]), _seq("b", [[0, 0]])  # 99: outside the vocabulary
    seen = state.seen([a, b], 2, 10)
    assert torch.equal(seen[0], _expected(a.token_rows, 10))
    assert torch.equal(seen[1], _expected(b.token_rows, 10))
    state.mark([a, b], torch.tensor([[5, 6], [7, 8]]))
    a.append([5, 6])
    b.append([7, 8])
    again = state.seen([b, a], 2, 10)
    assert torch.equal(again[0], _expected(b.token_rows, 10))
    assert torch.equal(again[1], _expected(a.token_rows, 10))
    state.mark([a], torch.tensor([[4]]), first_codebook=1)  # a depth level: one codebook
    assert bool(state.seen([a], 2, 10)[0, 1, 4]) and not bool(state.seen([a], 2, 10)[0, 0, 4])


def test_replaced_rows_make_the_row_again_and_many_streams_grow_the_table() -> None:
    state = RepetitionState(CPU)
    seqs = [_seq(f"s{i}", [[i, i + 1]]) for i in range(9)]  # past the table's first 4 rows
    seen = state.seen(seqs, 2, 12)
    for i, seq in enumerate(seqs):
        assert torch.equal(seen[i], _expected(seq.token_rows, 12))
    seqs[0].begin_context([[7, 7]])  # a restarting layout's next context
    assert torch.equal(state.seen(seqs[:1], 2, 12)[0], _expected([[7, 7]], 12))


def test_streams_no_longer_running_are_forgotten_and_their_rows_reused() -> None:
    state = RepetitionState(CPU)
    a, b = _seq("a", [[1]]), _seq("b", [[2]])
    state.seen([a, b], 1, 4)
    state.retain([b])
    assert state.owners() == [b]
    c = _seq("c", [[3]])
    assert torch.equal(state.seen([c], 1, 4)[0], _expected([[3]], 4))  # a's old row, made anew
    assert set(state.owners()) == {b, c}
