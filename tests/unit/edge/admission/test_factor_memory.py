"""The remembered realtime factor: kept per key across restarts, garbage ignored, and what
admission starts from until it has live windows of its own."""

from __future__ import annotations

import logging
import threading

import pytest

from cadenza.config import AdmissionConfig, EngineConfig
from cadenza.edge.admission.capacity import CapacityModel
from cadenza.edge.admission.factor_memory import (
    FILE_NAME,
    FactorMemory,
    default_dir,
    measured_under_load,
)
from tests.support.contract_examples import engine_info as info
from tests.support.contract_examples import timed_stats


def test_a_factor_is_recalled_by_its_key(tmp_path):
    memory = FactorMemory(tmp_path / "cache")
    assert memory.recall("a") is None  # nothing written yet
    memory.remember("a", 1.4)
    memory.remember("b", 1.2)
    memory.remember("a", 1.3)
    memory.remember("c", 0.2)  # below 1: clamped, a server is never faster than calibrated
    again = FactorMemory(tmp_path / "cache")
    assert again.recall("a") == pytest.approx(1.3) and again.recall("b") == pytest.approx(1.2)
    assert again.recall("c") == pytest.approx(1.0) and memory.recall("c") == pytest.approx(1.0)
    assert not [p for p in (tmp_path / "cache").iterdir() if p.name != FILE_NAME]


@pytest.mark.parametrize(
    "content", ["not json", "[1, 2]", '{"a": "fast"}', '{"a": 1e9}', '{"a": -1}', ""]
)
def test_garbage_in_the_file_counts_as_nothing_remembered(tmp_path, content):
    (tmp_path / FILE_NAME).write_text(content)
    memory = FactorMemory(tmp_path)
    assert memory.recall("a") is None
    memory.remember("a", 1.5)  # and is replaced by a good file
    assert FactorMemory(tmp_path).recall("a") == pytest.approx(1.5)


def test_a_failed_write_is_logged_not_raised(tmp_path, caplog):
    blocker = tmp_path / "file"
    blocker.write_text("")
    memory = FactorMemory(blocker / "below-a-file")
    with caplog.at_level(logging.WARNING):
        memory.remember("a", 1.5)
    assert "cannot remember" in caplog.text
    assert memory.recall("a") == pytest.approx(1.5)  # this server still knows it
    assert FactorMemory(blocker / "below-a-file").recall("a") is None  # the next one does not


def test_the_directory_is_the_calibrations(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert default_dir(None) == tmp_path / "cadenza"
    assert str(default_dir("/elsewhere")) == "/elsewhere"


def test_admission_starts_from_the_remembered_factor_until_it_has_its_own():
    admission = AdmissionConfig(unmeasured_factor=1.0)  # (no prior for an unmeasured CPU)
    fresh = CapacityModel(info(), EngineConfig(), admission)
    remembering = CapacityModel(info(), EngineConfig(), admission, remembered_factor=1.5)
    assert fresh.realtime_factor() == pytest.approx(1.0)  # the calibration's jitter
    assert remembering.realtime_factor() == pytest.approx(1.5)
    assert remembering.max_streams() < fresh.max_streams()
    assert not remembering.has_live_factor()
    for _ in range(9):  # three windows of live reports at the calibrated speed
        remembering.observe(timed_stats(1.0))
    assert remembering.has_live_factor() and remembering.realtime_factor() == pytest.approx(1.0)


@pytest.mark.parametrize(
    ("running", "claimed", "remembered"),
    [(8, 16, True), (7, 16, False), (16, 16, True), (20, 16, True), (0, 0, False), (1, 1, True)],
)
def test_only_a_factor_measured_under_load_is_passed_on(running, claimed, remembered):
    # half the replica's own claim at least (and a stream): lighter load runs closer to the
    # calibration and would promise the next server more than it holds
    assert measured_under_load(running, claimed) is remembered


def test_remember_soon_writes_on_the_memory_s_own_thread_in_order(tmp_path, monkeypatch):
    memory = FactorMemory(tmp_path)
    writers: list[str] = []
    write = memory._write

    def recording(key: str, factor: float) -> None:
        writers.append(threading.current_thread().name)
        write(key, factor)

    monkeypatch.setattr(memory, "_write", recording)
    pending = [memory.remember_soon("a", 1.1 + i / 10) for i in range(5)]
    assert memory.recall("a") == pytest.approx(1.5)  # known at once, before any write
    for future in pending:
        future.result(timeout=10)
    assert FactorMemory(tmp_path).recall("a") == pytest.approx(1.5)  # the last, written last
    assert len(writers) == 5 and all(name.startswith("cadenza-factors") for name in writers)
    assert threading.current_thread().name not in writers


def test_recall_never_touches_the_disk(tmp_path, monkeypatch):
    (tmp_path / FILE_NAME).write_text('{"a": 1.3}')
    memory = FactorMemory(tmp_path)  # read here, once

    def no_disk() -> dict[str, float]:
        raise AssertionError("recall read the file")

    monkeypatch.setattr(memory, "_read", no_disk)
    assert memory.recall("a") == pytest.approx(1.3) and memory.recall("b") is None
