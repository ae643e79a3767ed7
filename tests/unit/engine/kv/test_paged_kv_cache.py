"""The KV memory: pages a budget buys, the pad page fixed-shape steps write to, and the
budget's defaults per device."""

from __future__ import annotations

import pytest
import torch

from cadenza.config import EngineConfig
from cadenza.engine.device import available_memory_bytes
from cadenza.engine.kv.paged_kv_cache import (
    CPU_KV_FRACTION,
    KVSpec,
    PagedKVCache,
    kv_budget_bytes,
)

SPEC = KVSpec(num_layers=2, num_kv_heads=2, head_dim=4)
CPU = torch.device("cpu")


def test_a_budget_buys_whole_pages_and_the_pad_page_is_one_of_them() -> None:
    page_bytes = SPEC.bytes_per_page(4, torch.float32)
    plain = PagedKVCache.from_budget(SPEC, 10 * page_bytes + 7, 4, torch.float32, CPU)
    assert (plain.num_pages, plain.pad_page, plain.keys.shape[1]) == (10, None, 10)
    padded = PagedKVCache.from_budget(SPEC, 10 * page_bytes, 4, torch.float32, CPU, pad_page=True)
    assert (padded.num_pages, padded.pad_page, padded.keys.shape[1]) == (9, 9, 10)
    assert padded.nbytes == plain.nbytes  # the budget holds the pad page too


def test_a_budget_without_a_page_for_the_pool_is_refused() -> None:
    page_bytes = SPEC.bytes_per_page(4, torch.float32)
    with pytest.raises(ValueError, match="holds no page"):
        PagedKVCache.from_budget(SPEC, page_bytes - 1, 4, torch.float32, CPU)
    with pytest.raises(ValueError, match="holds no page"):
        PagedKVCache.from_budget(SPEC, page_bytes, 4, torch.float32, CPU, pad_page=True)
    with pytest.raises(ValueError, match="at least one page"):
        PagedKVCache(SPEC, 0, 4, torch.float32, CPU)


def test_the_budget_is_the_bytes_given_else_a_share_of_free_memory_less_what_is_reserved() -> None:
    assert kv_budget_bytes(EngineConfig(kv_cache_memory_bytes=1234), CPU, reserved=99) == 1234
    free = available_memory_bytes(CPU)
    default = kv_budget_bytes(EngineConfig(), CPU)
    assert default == pytest.approx(free * CPU_KV_FRACTION, rel=0.05)
    named = kv_budget_bytes(EngineConfig(kv_cache_memory_fraction=0.1), CPU, reserved=1 << 20)
    assert named == pytest.approx(free * 0.1 - (1 << 20), rel=0.05)
    everything = kv_budget_bytes(EngineConfig(kv_cache_memory_fraction=0.01), CPU, 1 << 50)
    assert everything == 0
