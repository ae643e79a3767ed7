"""The remembered realtime factor: kept per key across restarts with the time it was measured,
garbage ignored with a warning, and a hint to admission that ages and is bounded."""

from __future__ import annotations

import json
import logging
import threading

import pytest

from cadenza.config import AdmissionConfig
from cadenza.edge.admission.capacity import CapacityModel
from cadenza.edge.admission.factor_memory import (
    FILE_NAME,
    FactorMemory,
    RememberedFactor,
    default_dir,
    measured_under_load,
)
from tests.support.contract_examples import engine_info as info
from tests.support.contract_examples import timed_stats


class WallClock:
    now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def test_a_factor_is_recalled_by_its_key_with_its_age(tmp_path):
    clock = WallClock()
    memory = FactorMemory(tmp_path / "cache", clock=clock)
    assert memory.recall("a") is None  # nothing written yet
    memory.remember("a", 1.4)
    memory.remember("b", 1.2)
    clock.now += 30.0
    memory.remember("a", 1.3)
    memory.remember("c", 0.2)  # below 1: clamped, a server is never faster than calibrated
    clock.now += 10.0
    again = FactorMemory(tmp_path / "cache", clock=clock)
    assert again.recall("a") == RememberedFactor(pytest.approx(1.3), pytest.approx(10.0))
    assert again.recall("b") == RememberedFactor(pytest.approx(1.2), pytest.approx(40.0))
    assert again.recall("c").factor == pytest.approx(1.0) == memory.recall("c").factor
    assert not [p for p in (tmp_path / "cache").iterdir() if p.name != FILE_NAME]


@pytest.mark.parametrize(
    "content",
    [
        "not json",
        "[1, 2]",
        '{"a": "fast"}',
        '{"a": 1.3}',  # a bare number: no time it was measured
        '{"a": {"factor": 1e9, "at": 0}}',
        '{"a": {"factor": -1, "at": 0}}',
        '{"a": {"factor": 1.3, "at": 9e18}}',  # measured in the future
        '{"a": {"factor": 1.3}}',
        '{"a": {"factor": NaN, "at": 0}}',
    ],
)
def test_garbage_in_the_file_is_ignored_with_a_warning(tmp_path, content, caplog):
    (tmp_path / FILE_NAME).write_text(content)
    with caplog.at_level(logging.WARNING):
        memory = FactorMemory(tmp_path)
    assert memory.recall("a") is None
    assert "ignoring" in caplog.text
    memory.remember("a", 1.5)  # and is replaced by a good file
    assert FactorMemory(tmp_path).recall("a").factor == pytest.approx(1.5)


def test_an_empty_or_missing_file_is_nothing_remembered_quietly(tmp_path, caplog):
    with caplog.at_level(logging.WARNING):
        assert FactorMemory(tmp_path).recall("a") is None
    assert caplog.text == ""


def test_a_failed_write_is_logged_not_raised(tmp_path, caplog):
    blocker = tmp_path / "file"
    blocker.write_text("")
    memory = FactorMemory(blocker / "below-a-file")
    with caplog.at_level(logging.WARNING):
        memory.remember("a", 1.5)
    assert "cannot remember" in caplog.text
    assert memory.recall("a").factor == pytest.approx(1.5)  # this server still knows it
    assert FactorMemory(blocker / "below-a-file").recall("a") is None  # the next one does not


def test_the_directory_is_the_calibrations(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert default_dir(None) == tmp_path / "cadenza"
    assert str(default_dir("/elsewhere")) == "/elsewhere"


def test_admission_starts_from_the_remembered_factor_until_it_has_its_own():
    admission = AdmissionConfig(unmeasured_factor=1.0)  # (no prior for an unmeasured CPU)
    fresh = CapacityModel(info(), admission)
    remembering = CapacityModel(info(), admission, remembered=RememberedFactor(1.2, 0.0))
    assert fresh.realtime_factor() == pytest.approx(1.0)  # the calibration's jitter
    assert remembering.realtime_factor() == pytest.approx(1.2)
    assert remembering.max_streams() < fresh.max_streams()
    assert not remembering.estimator.has_live_factor()
    for _ in range(9):  # three windows of live reports at the calibrated speed
        remembering.observe(timed_stats(1.0))
    assert remembering.estimator.has_live_factor()
    assert remembering.realtime_factor() == pytest.approx(1.0)


def test_a_remembered_factor_is_a_hint_that_ages_and_is_bounded():
    admission = AdmissionConfig(
        unmeasured_factor=1.4, remembered_factor_half_life_s=600.0, remembered_factor_cap=1.25
    )

    def prior(factor: float, age_s: float) -> float:
        model = CapacityModel(info(), admission, remembered=RememberedFactor(factor, age_s))
        return model.realtime_factor()

    assert prior(1.2, 0.0) == pytest.approx(1.2)  # fresh: as measured
    assert prior(1.2, 600.0) == pytest.approx(1.3)  # half way back to the default
    assert prior(1.2, 36_000.0) == pytest.approx(1.4, abs=1e-6)  # long forgotten
    assert prior(20.0, 0.0) == pytest.approx(
        1.75
    )  # capped: a busy machine is measured, not assumed
    assert prior(20.0, 1200.0) == pytest.approx(1.4 + 0.35 / 4)


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

    def recording(key: str, entry: tuple[float, float]) -> None:
        writers.append(threading.current_thread().name)
        write(key, entry)

    monkeypatch.setattr(memory, "_write", recording)
    pending = [memory.remember_soon("a", 1.1 + i / 10) for i in range(5)]
    assert memory.recall("a").factor == pytest.approx(1.5)  # known at once, before any write
    for future in pending:
        future.result(timeout=10)
    assert FactorMemory(tmp_path).recall("a").factor == pytest.approx(1.5)  # the last, written last
    assert len(writers) == 5 and all(name.startswith("cadenza-factors") for name in writers)
    assert threading.current_thread().name not in writers


def test_recall_never_touches_the_disk(tmp_path, monkeypatch):
    (tmp_path / FILE_NAME).write_text(json.dumps({"a": {"factor": 1.3, "at": 0.0}}))
    memory = FactorMemory(tmp_path)  # read here, once

    def no_disk(warn: bool = False) -> dict[str, tuple[float, float]]:
        raise AssertionError("recall read the file")

    monkeypatch.setattr(memory, "_read", no_disk)
    assert memory.recall("a").factor == pytest.approx(1.3) and memory.recall("b") is None
