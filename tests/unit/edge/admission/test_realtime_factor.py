"""The realtime factor's recovery: a probe on an idle engine ends a load's verdict, the claim
climbs back at a bounded rate, a slowdown still cuts it at once, and a remembered factor is a
hint that a probe overrules."""

from __future__ import annotations

import math

import pytest

from cadenza.config import AdmissionConfig
from cadenza.contract.engine_stats import StepRecord, StepReport
from cadenza.edge.admission.capacity import CapacityModel
from cadenza.edge.admission.factor_memory import RememberedFactor
from cadenza.edge.admission.realtime_factor import RealtimeFactorEstimator
from tests.support.contract_examples import engine_info as info
from tests.support.contract_examples import timed_stats


class Clock:
    now = 0.0

    def __call__(self) -> float:
        return self.now


def probe(ratio: float, steps: int = 15) -> StepReport:
    """A probe's steps: 4 synthetic streams, ``ratio`` times what the model predicts."""
    return StepReport(steps=(StepRecord(0.004 * ratio, 4, 4, 400),) * steps)


def serve(model: CapacityModel, clock: Clock, seconds: float, ratio: float) -> None:
    """Live reports every 0.5 s for ``seconds``, steps ``ratio`` times the model."""
    for _ in range(round(seconds / 0.5)):
        model.observe(timed_stats(ratio))
        clock.now += 0.5


def test_a_hiccup_costs_its_duration_and_a_bounded_climb_not_minutes() -> None:
    clock = Clock()
    config = AdmissionConfig(factor_climb_s=10.0)
    model = CapacityModel(info(), config, clock=clock)
    idle_claim = model.max_streams(model.estimator.serving_floor)
    assert model.estimator.serving_floor == pytest.approx(1.4)  # an unmeasured CPU
    serve(model, clock, 20.0, 7.0)  # busy loops take the cores: steps run 7x slow
    assert model.realtime_factor() == pytest.approx(7.0) and model.max_streams() == 1
    assert model.estimator.wants_probe()
    clock.now += 2.0  # the load is gone; the engine is idle and probes: full speed
    assert model.observe_probe(probe(1.0))
    # Not at once: the factor the load measured falls e-fold every factor_climb_s...
    assert model.realtime_factor() == pytest.approx(7.0)
    clock.now += 10.0
    assert model.realtime_factor() == pytest.approx(7.0 / math.e)
    # ...so the claim is back above 0.7 of the idle claim well within 30 s of the load ending
    clock.now += 6.0
    assert model.max_streams() >= 0.7 * idle_claim
    clock.now += 10.0
    assert model.realtime_factor() == pytest.approx(1.4)  # the serving floor, no lower
    assert model.max_streams() == idle_claim and not model.estimator.wants_probe()


def test_without_a_probe_a_load_s_verdict_holds_as_before() -> None:
    clock = Clock()
    model = CapacityModel(info(), AdmissionConfig(), clock=clock)
    serve(model, clock, 20.0, 7.0)
    clock.now += 120.0  # no reports: nothing measured, the last verdict stands
    assert model.realtime_factor() == pytest.approx(7.0)


def test_a_slowdown_still_cuts_the_claim_at_once() -> None:
    clock = Clock()
    model = CapacityModel(info(), AdmissionConfig(), clock=clock)
    serve(model, clock, 20.0, 7.0)
    model.observe_probe(probe(1.0))
    clock.now += 30.0
    assert model.realtime_factor() == pytest.approx(1.4)
    assert model.observe_probe(probe(5.0))  # still busy: a slower probe counts at once,
    assert model.realtime_factor() == pytest.approx(5.0 * 1.4)  # times the serving floor
    model.observe_probe(probe(1.0))
    clock.now += 30.0
    assert model.realtime_factor() == pytest.approx(1.4)
    serve(model, clock, 2.0, 3.0)  # and so does a slower live window after a probe
    assert model.realtime_factor() == pytest.approx(3.0)


def test_a_probe_with_too_little_decoding_says_nothing() -> None:
    model = CapacityModel(info(), AdmissionConfig())
    assert not model.observe_probe(probe(1.0, steps=2))
    assert not model.observe_probe(StepReport())
    assert model.estimator.probes == 0


def test_a_restart_with_an_absurd_remembered_factor_claims_most_of_its_share_at_once() -> None:
    clock = Clock()
    remembered = RememberedFactor(20.0, age_s=5.0)
    model = CapacityModel(info(), AdmissionConfig(), clock=clock, remembered=remembered)
    fresh = CapacityModel(info(), AdmissionConfig(), clock=clock)
    assert model.realtime_factor() == pytest.approx(1.75, abs=0.01)  # capped: 1.25 x 1.4
    assert model.max_streams() >= 0.7 * fresh.max_streams()
    assert not model.estimator.wants_probe()  # nothing a probe could show: it is the floor
    serve(model, clock, 6.0, 1.0)  # served steps at the calibrated speed replace it
    assert model.realtime_factor() == pytest.approx(1.0)


def test_a_remembered_factor_is_the_serving_floor() -> None:
    remembered = RememberedFactor(1.15, age_s=0.0)
    model = CapacityModel(info(), AdmissionConfig(), remembered=remembered)
    assert model.estimator.serving_floor == pytest.approx(1.15)
    assert not model.estimator.wants_probe()  # the claim is where a probe could take it
    model.observe_probe(probe(1.0))
    assert model.realtime_factor() == pytest.approx(1.15)  # an idle probe never counts faster


def test_only_a_calibrated_engine_wants_probes() -> None:
    estimator = RealtimeFactorEstimator(info(calibrated=False), AdmissionConfig())
    assert not estimator.wants_probe()


def test_probe_windows_do_not_count_as_live_ones_for_remembering() -> None:
    model = CapacityModel(info(), AdmissionConfig())
    for _ in range(3):
        model.observe_probe(probe(1.0))
    assert not model.estimator.has_live_factor()


def test_probes_back_off_while_they_cannot_raise_the_claim() -> None:
    clock = Clock()
    model = CapacityModel(info(), AdmissionConfig(probe_interval_s=2.0), clock=clock)
    serve(model, clock, 20.0, 3.0)
    estimator = model.estimator

    def ask_and_answer(ratio: float) -> float:
        """Ask when due; the wait until the next one is due."""
        assert estimator.probe_due()
        estimator.probe_asked()
        asked = clock.now
        model.observe_probe(probe(ratio))
        for _ in range(1000):
            if estimator.probe_due():
                return clock.now - asked
            clock.now += 0.5
        raise AssertionError("no probe due any more")

    # The busy loops go on: a probe that finds the machine at twice its calibration says
    # the load is not over; it raises no claim, and every one doubles the wait.
    waits = [ask_and_answer(2.0) for _ in range(7)]
    assert model.realtime_factor() == pytest.approx(3.0)
    assert waits == pytest.approx([4.0, 8.0, 8.0, 8.0, 8.0, 8.0, 8.0])  # at most 4x the interval
    assert ask_and_answer(1.0) == pytest.approx(2.0)  # one that helps resets it


def test_a_probe_that_finds_the_load_still_on_is_evidence_not_an_end() -> None:
    clock = Clock()
    model = CapacityModel(info(), AdmissionConfig(), clock=clock)
    serve(model, clock, 20.0, 5.0)
    assert model.observe_probe(probe(3.0))  # idle engine, busy machine
    assert model.realtime_factor() == pytest.approx(5.0)  # the windows and their hold stand
    clock.now += 20.0
    assert model.realtime_factor() == pytest.approx(5.0)  # no climb from it
