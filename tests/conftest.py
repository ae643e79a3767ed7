"""Shared fixtures: one tiny engine per session (building it costs about a second)."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile

import pytest
from hypothesis import settings

# Real infrastructure for the tests that need it (each skips when its program is missing):
# the fixtures `haproxy` and `redis_server`.
pytest_plugins = ("tests.support.haproxy_process", "tests.support.redis_process")

# CI replays the same examples every run (a failure there must be reproducible); locally every
# run explores new ones.
settings.register_profile("ci", derandomize=True, deadline=None)
if os.environ.get("CI"):
    settings.load_profile("ci")

# Triton kernels run in Triton's interpreter on the CPU (set before anything imports triton).
os.environ.setdefault("TRITON_INTERPRET", "1")
# Tests run the engine on the CPU whatever the machine has.
os.environ.setdefault("CADENZA_MODEL__DEVICE", "cpu")
# A small KV cache: enough for the tests' streams, and cheap to allocate in every server.
os.environ.setdefault("CADENZA_ENGINE__KV_CACHE_MEMORY_BYTES", str(256 << 20))
# The session's shared calibration is measured on a machine that runs the test suite too: its
# consistency checks are tested on their own (tests/unit/engine/realtime), not left to the
# noise of whatever else runs.
os.environ.setdefault("CADENZA_CALIBRATION__TOLERANCE", "100")
# Every server of the session shares one calibration (measured once, by the first to start),
# kept out of the user's cache.
if "CADENZA_CALIBRATION__CACHE_DIR" not in os.environ:
    _calibration_dir = tempfile.mkdtemp(prefix="cadenza-calibration-")
    atexit.register(shutil.rmtree, _calibration_dir, ignore_errors=True)
    os.environ["CADENZA_CALIBRATION__CACHE_DIR"] = _calibration_dir


@pytest.fixture(scope="session")
def tiny_engine():
    from cadenza.engine.engine import Engine
    from tests.support.float32_compute import float32_cpu_config

    # float32 compute: tests compare it with references (the naive engine, offline decode).
    return Engine.from_pretrained(
        "cadenza-tiny",
        cpu=float32_cpu_config(),
        device="cpu",
        seed=0,
        kv_cache_memory_bytes=64 << 20,
    )
