"""Shared fixtures: one tiny engine per session (building it costs about a second)."""

from __future__ import annotations

import os

import pytest

# Tests run the engine on the CPU whatever the machine has, with few threads: CI has 2 cores.
os.environ.setdefault("CADENZA_MODEL__DEVICE", "cpu")


@pytest.fixture(scope="session")
def tiny_engine():
    from cadenza.engine.engine import Engine

    return Engine.from_pretrained("cadenza-tiny", device="cpu", seed=0)
