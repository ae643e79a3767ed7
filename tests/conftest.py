"""Shared fixtures: one tiny engine per session (building it costs about a second)."""

from __future__ import annotations

import os

import pytest

# Tests run the engine on the CPU whatever the machine has, with few threads: CI has 2 cores.
os.environ.setdefault("CADENZA_MODEL__DEVICE", "cpu")
# A small KV cache: enough for the tests' streams, and cheap to allocate in every server.
os.environ.setdefault("CADENZA_ENGINE__KV_CACHE_MEMORY_BYTES", str(256 << 20))


@pytest.fixture(scope="session")
def tiny_engine():
    from cadenza.engine.engine import Engine

    return Engine.from_pretrained(
        "cadenza-tiny", device="cpu", seed=0, kv_cache_memory_bytes=64 << 20
    )
