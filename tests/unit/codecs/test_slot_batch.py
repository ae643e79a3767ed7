"""A call's slots on the host and on the device, kept in step."""

from __future__ import annotations

import torch

from cadenza.codecs.slot_batch import SlotBatch


def test_the_host_ids_and_the_device_index_are_the_same_slots() -> None:
    slots = SlotBatch.on([3, 0, 2], "cpu")
    assert slots.ids == [3, 0, 2] and slots.index.tolist() == [3, 0, 2]
    assert slots.index.dtype == torch.int64 and len(slots) == 3


def test_some_rows_keep_their_slots_in_the_order_asked() -> None:
    chosen = SlotBatch.on([3, 0, 2], "cpu").rows([2, 0])
    assert chosen.ids == [2, 3] and chosen.index.tolist() == [2, 3]
    assert len(SlotBatch.on([5], "cpu").rows([])) == 0


def test_the_ids_are_copied_not_shared() -> None:
    ids = [1, 2]
    slots = SlotBatch.on(ids, "cpu")
    ids.append(3)
    assert slots.ids == [1, 2]
