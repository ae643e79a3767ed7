"""The CPU's dense decode copy against gathering pages, step after step: sequences join, leave,
sit steps out, prefill again and outgrow the copy; int8 pages; the byte limit."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from cadenza.kernels import torch_attention
from cadenza.kernels.dense_decode_kv import DenseDecodeKV
from cadenza.kernels.kv_quant import SCALE_DTYPE

PAGE, KV_HEADS, HEADS, DIM, LAYERS = 4, 2, 4, 8, 2


class _World:
    """A paged cache of ``LAYERS`` layers and sequences that grow one token per decode."""

    def __init__(self, dtype: torch.dtype = torch.float32, num_pages: int = 64) -> None:
        self.generator = torch.Generator().manual_seed(0)
        shape = (LAYERS, num_pages, PAGE, KV_HEADS, DIM)
        self.keys = torch.zeros(shape, dtype=dtype)
        self.values = torch.zeros(shape, dtype=dtype)
        self.scales = None
        if dtype == torch.int8:
            self.scales = (
                torch.zeros(shape[:-1], dtype=SCALE_DTYPE),
                torch.zeros(shape[:-1], dtype=SCALE_DTYPE),
            )
        self.free = list(range(num_pages))[::-1]
        self.tables: dict[str, list[int]] = {}
        self.lengths: dict[str, int] = {}

    def layer_scales(self, layer: int):
        if self.scales is None:
            return None, None
        return self.scales[0][layer], self.scales[1][layer]

    def store(self, name: str, count: int) -> list[int]:
        """Write ``count`` new random tokens of ``name`` into every layer; their slots."""
        table = self.tables.setdefault(name, [])
        start = self.lengths.get(name, 0)
        slots = []
        for position in range(start, start + count):
            if position // PAGE >= len(table):
                table.append(self.free.pop())
            slots.append(table[position // PAGE] * PAGE + position % PAGE)
        self.lengths[name] = start + count
        mapping = torch.tensor(slots, dtype=torch.int64)
        for layer in range(LAYERS):
            k = torch.randn(count, KV_HEADS, DIM, generator=self.generator)
            v = torch.randn(count, KV_HEADS, DIM, generator=self.generator)
            k_scale, v_scale = self.layer_scales(layer)
            torch_attention.store_kv(
                k, v, self.keys[layer], self.values[layer], mapping, k_scale, v_scale
            )
        return slots

    def drop(self, name: str) -> None:
        self.free.extend(self.tables.pop(name))
        self.lengths.pop(name)

    def batch(self, names: list[str]) -> tuple[np.ndarray, np.ndarray]:
        width = max(len(self.tables[n]) for n in names)
        tables = np.full((len(names), width), -1, dtype=np.int32)
        for i, name in enumerate(names):
            tables[i, : len(self.tables[name])] = self.tables[name]
        return tables, np.array([self.lengths[n] for n in names], dtype=np.int32)


def _check_step(world: _World, dense: DenseDecodeKV, names: list[str], **kwargs) -> None:
    """Every layer's dense attention for ``names`` equals gathering their pages."""
    tables, lengths = world.batch(names)
    final = kwargs.pop("final", lengths + 8)
    step = dense.plan(names, tables, lengths, final, PAGE, **kwargs)
    assert step is not None
    for layer in range(LAYERS):
        q = torch.randn(len(names), HEADS, DIM, generator=world.generator)
        k_scale, v_scale = world.layer_scales(layer)
        expected = torch_attention.torch_paged_decode_attention(
            q,
            world.keys[layer],
            world.values[layer],
            torch.from_numpy(tables),
            torch.from_numpy(lengths),
            0.3,
            k_scale=k_scale,
            v_scale=v_scale,
        )
        got = step.attend(layer, q, world.keys[layer], world.values[layer], 0.3, k_scale, v_scale)
        torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-6)


def _dense(**kwargs) -> DenseDecodeKV:
    settings = {"max_bytes": 1 << 30, **kwargs}
    dense = DenseDecodeKV(LAYERS, KV_HEADS, DIM, torch.float32, torch.device("cpu"), **settings)
    dense.min_context = 0  # short test sequences use the copy too
    return dense


def test_short_batches_gather_and_leave_the_copy_as_it_is():
    world = _World()
    world.store("a", 5)
    tables, lengths = world.batch(["a"])
    dense = DenseDecodeKV(LAYERS, KV_HEADS, DIM, torch.float32, torch.device("cpu"), 1 << 30)
    assert dense.min_context > 5
    assert dense.plan(["a"], tables, lengths, lengths + 8, PAGE) is None
    assert dense.owners() == {} and dense.keys is None
    dense.min_context = 5
    assert dense.plan(["a"], tables, lengths, lengths + 8, PAGE) is not None
    assert list(dense.owners()) == ["a"]


@pytest.mark.parametrize("cache_dtype", [torch.float32, torch.bfloat16, torch.int8])
def test_dense_attention_equals_gathering_across_a_changing_batch(cache_dtype):
    world, dense = _World(cache_dtype), _dense()
    for name, prompt in (("a", 5), ("b", 1), ("c", 9)):
        world.store(name, prompt)
    _check_step(world, dense, ["a", "b", "c"])  # everyone's history is copied in
    for _ in range(3):
        for name in ("a", "b", "c"):
            world.store(name, 1)
        _check_step(world, dense, ["c", "a", "b"])  # another order: rows stay put
    # b sits a step out and keeps its row; c finishes; d arrives.
    world.store("a", 1)
    world.drop("c")
    dense.retain(["a", "b"])
    world.store("d", 6)
    _check_step(world, dense, ["d", "a"])
    assert set(dense.owners()) == {"a", "b", "d"}
    for name in ("a", "b", "d"):
        world.store(name, 1)
    _check_step(world, dense, ["a", "b", "d"])
    # a is preempted and prefills again (its keys are recomputed): it loses its row.
    world.drop("a")
    world.store("a", 12)
    for name in ("b", "d"):
        world.store(name, 1)
    _check_step(world, dense, ["b", "d"], invalidate=["a"])
    assert "a" not in dense.owners()
    world.store("a", 1)
    _check_step(world, dense, ["a", "b", "d"])


def test_rows_are_reused_and_a_released_row_is_overwritten():
    world, dense = _World(), _dense()
    for name in ("a", "b"):
        world.store(name, 7)
    _check_step(world, dense, ["a", "b"])
    row_of_a = dense.owners()["a"]
    world.drop("a")
    dense.retain(["b"])
    world.store("c", 3)  # shorter than a: a's stale positions must stay masked
    world.store("b", 1)
    _check_step(world, dense, ["c", "b"])
    assert dense.owners()["c"] == row_of_a


def test_a_step_that_did_not_use_the_copy_makes_it_copy_the_history_again():
    world, dense = _World(), _dense()
    world.store("a", 5)
    _check_step(world, dense, ["a"])
    world.store("a", 1)  # this token's step gathered pages instead
    world.store("a", 1)
    _check_step(world, dense, ["a"])


def test_growing_rows_and_positions_keeps_what_the_copy_holds():
    world, dense = _World(num_pages=256), _dense()
    names = [f"s{i}" for i in range(3)]
    for name in names:
        world.store(name, 3)
    _check_step(world, dense, names, final=np.full(3, 10))
    rows, positions = dense.row_capacity, dense.position_capacity
    more = names + [f"t{i}" for i in range(rows)]
    for name in more:
        world.store(name, 1 if name in names else 2)
    _check_step(world, dense, more, final=np.full(len(more), positions + 1))
    assert dense.row_capacity > rows and dense.position_capacity > positions
    for name in more:
        world.store(name, 1)
    _check_step(world, dense, more, final=np.full(len(more), positions + 1))


def test_past_the_byte_limit_the_step_gathers_and_the_copy_is_dropped():
    world = _World()
    world.store("a", 5)
    tables, lengths = world.batch(["a"])
    dense = _dense(max_bytes=1000)
    assert dense.plan(["a"], tables, lengths, lengths + 8, PAGE) is None
    assert dense.owners() == {} and dense.nbytes == 0
    roomy = _dense()
    assert roomy.plan(["a"], tables, lengths, lengths + 8, PAGE) is not None
    limit = roomy.nbytes
    roomy.max_bytes = limit
    world.store("b", 2)
    tables, lengths = world.batch(["a", "b"])
    assert roomy.plan(["a", "b"], tables, lengths, np.array([8, 2000]), PAGE) is None
    assert roomy.owners() == {} and roomy.keys is None


def test_a_reused_row_hides_its_previous_owners_keys_even_nan():
    world, dense = _World(), _dense()
    world.store("a", 9)
    world.store("b", 3)
    _check_step(world, dense, ["a", "b"])
    row_of_a = dense.owners()["a"]
    assert dense.keys is not None
    dense.keys[:, row_of_a] = float("nan")  # what a failing sequence may leave behind
    dense.values[:, row_of_a] = float("nan")
    world.drop("a")
    dense.retain(["b"])
    world.store("c", 2)
    world.store("b", 9)  # b now reaches past where a's keys were
    _check_step(world, dense, ["b", "c"])
    assert dense.owners()["c"] == row_of_a


def test_a_step_planned_but_not_attended_is_copied_again_once_released():
    world, dense = _World(), _dense()
    world.store("a", 6)
    _check_step(world, dense, ["a"])
    world.store("a", 1)
    tables, lengths = world.batch(["a"])
    planned = dense.plan(["a"], tables, lengths, lengths + 8, PAGE)
    assert planned is not None and planned.sources.numel() == KV_HEADS  # one token
    dense.release(["a"])  # the forward pass failed before attending
    again = dense.plan(["a"], tables, lengths, lengths + 8, PAGE)
    assert again is not None and again.sources.numel() == 7 * KV_HEADS  # the whole history
    dense.release(["a"])
    _check_step(world, dense, ["a"])


def test_the_tensors_are_freed_when_no_row_is_left():
    world, dense = _World(), _dense()
    world.store("a", 4)
    _check_step(world, dense, ["a"])
    assert dense.nbytes > 0
    dense.retain([])
    assert dense.owners() == {} and dense.nbytes == 0
