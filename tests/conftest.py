"""Shared fixtures: one tiny engine per session (building it costs about a second)."""

from __future__ import annotations

import os

import pytest
from hypothesis import settings

# CI replays the same examples every run (a failure there must be reproducible); locally every
# run explores new ones.
settings.register_profile("ci", derandomize=True, deadline=None)
if os.environ.get("CI"):
    settings.load_profile("ci")

# Tests run the engine on the CPU whatever the machine has.
os.environ.setdefault("CADENZA_MODEL__DEVICE", "cpu")
# A small KV cache: enough for the tests' streams, and cheap to allocate in every server.
os.environ.setdefault("CADENZA_ENGINE__KV_CACHE_MEMORY_BYTES", str(256 << 20))


@pytest.fixture(scope="session")
def tiny_engine():
    from cadenza.engine.engine import Engine

    return Engine.from_pretrained(
        "cadenza-tiny", device="cpu", seed=0, kv_cache_memory_bytes=64 << 20
    )
