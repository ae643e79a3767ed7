"""The capacity model: KV and real-time limits from the engine's numbers, closing on slack."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from cadenza.config import AdmissionConfig
from cadenza.contract.arrival_wave import WavePoint
from cadenza.edge.admission.capacity import AdmittedLoad as Load
from cadenza.edge.admission.capacity import CapacityModel, RunningStream, StreamCost
from cadenza.edge.admission.factor_memory import RememberedFactor
from tests.support.contract_examples import engine_info as info
from tests.support.contract_examples import engine_stats, timed_stats
from tests.support.contract_examples import stats_message as stats


class Clock:
    now = 0.0

    def __call__(self) -> float:
        return self.now


def test_realtime_limit_follows_the_model_and_the_90th_percentile_of_live_steps() -> None:
    clock = Clock()
    # (the percentile alone here; how slowly a faster verdict is believed: the next test)
    # (the percentile alone here, no prior for an unmeasured CPU: the test after the next)
    admission = AdmissionConfig(factor_recovery_s=0.0, unmeasured_factor=1.0)
    model = CapacityModel(info(), admission, clock=clock)
    assert model.step_budget_ms == pytest.approx(1000 / 75 * 0.9)
    assert model.realtime_limit() == 12
    assert model.max_streams() == 12
    model.observe(timed_stats(2.0))  # steps take twice what was calibrated
    assert model.realtime_factor() == pytest.approx(2.0)  # at once: the worst report counts
    for _ in range(8):
        model.observe(timed_stats(2.0))
    assert model.realtime_factor() == pytest.approx(2.0)
    assert model.realtime_limit() == 6
    assert model.refusal(Load(6, 0), StreamCost(10, 3.0)) == "realtime_budget"
    assert model.refusal(Load(5, 0), StreamCost(10, 3.0)) is None
    # A percentile over windows of the engine's lead (1.5 s: three reports), not a mean: one
    # slow window in ten is enough to count...
    assert model.estimator.window_s == pytest.approx(1.5)
    clock.now = 31.0  # (the reports above have left the 30 s window)
    for _ in range(27):
        model.observe(timed_stats(1.0))
    for _ in range(3):
        model.observe(timed_stats(3.0))
    assert model.realtime_factor() == pytest.approx(3.0)
    assert model.realtime_limit() == 4
    # ...while one slow report is a slow spell the streams' lead absorbs: its window's mean.
    clock.now = 62.0
    for _ in range(29):
        model.observe(timed_stats(1.0))
    model.observe(timed_stats(4.0))
    assert model.realtime_factor() == pytest.approx(2.0)  # (1 + 1 + 4) / 3
    for _ in range(20):
        model.observe(timed_stats(100.0))  # no stream fits the budget any more...
    assert model.realtime_limit() == 0
    idle = Load(0, 0)
    assert model.refusal(idle, StreamCost(10, 3.0)) is None  # ...but an idle server admits one
    assert model.refusal(Load(1, 0), StreamCost(10, 3.0)) == "realtime_budget"
    clock.now = 93.0  # the window has passed, but nothing newer: the last verdict stands
    assert model.realtime_limit() == 0
    for _ in range(30):  # new reports (ten windows of them) replace it
        model.observe(timed_stats(1.0))
    assert model.realtime_factor() == pytest.approx(1.0) and model.realtime_limit() == 12


def test_a_slower_verdict_counts_at_once_and_a_faster_one_only_once_it_has_held() -> None:
    clock = Clock()
    admission = AdmissionConfig()
    model = CapacityModel(info(), admission, clock=clock)

    def run(seconds: float, ratio: float) -> None:
        for _ in range(round(seconds / 0.5)):  # a report every 0.5 s
            model.observe(timed_stats(ratio))
            clock.now += 0.5

    run(15.0, 1.0)  # ten windows at the calibrated speed
    assert model.realtime_factor() == pytest.approx(1.0) and model.realtime_limit() == 12
    run(15.0, 2.0)  # a slow spell counts as soon as its windows are the percentile
    assert model.realtime_factor() == pytest.approx(2.0) and model.realtime_limit() == 6
    while model.estimator.evidence() > 1.0:  # full speed until the windows say so
        run(0.5, 1.0)
    faster_since = clock.now
    assert model.realtime_factor() == pytest.approx(2.0)  # the slow verdict still stands...
    run(admission.factor_recovery_s - 1.0, 1.0)
    assert model.realtime_factor() == pytest.approx(2.0)
    run(2.0, 1.0)  # ...until the faster one has held for factor_recovery_s
    assert clock.now - faster_since > admission.factor_recovery_s
    assert model.realtime_factor() == pytest.approx(1.0) and model.realtime_limit() == 12


def test_each_window_weighs_the_decode_work_it_measured() -> None:
    clock = Clock()
    admission = AdmissionConfig(factor_recovery_s=0.0, unmeasured_factor=1.0)
    model = CapacityModel(info(), admission, clock=clock)
    for _ in range(27):  # nine full windows at the calibrated speed
        model.observe(timed_stats(1.0))
    # A window in which the engine barely decoded (a fifth of the others' work), twice as
    # slow: as at the start of a wave of new streams. One window in ten, but not a tenth of
    # the work: the percentile stays where the full batches ran.
    for _ in range(3):
        model.observe(timed_stats(2.0, steps=3))
    assert len(model.estimator.windows) == 10
    assert model.realtime_factor() == pytest.approx(1.0)
    # A full window as slow too: more than a tenth of the work ran twice as slow, at once.
    for _ in range(3):
        model.observe(timed_stats(2.0))
    assert model.realtime_factor() == pytest.approx(2.0)
    # The window being filled weighs what it has measured so far, too.
    fresh = CapacityModel(info(), admission, clock=clock)
    for _ in range(30):
        fresh.observe(timed_stats(1.0))
    fresh.observe(timed_stats(3.0, steps=5))
    assert fresh.realtime_factor() == pytest.approx(1.0)


def test_an_unmeasured_cpu_engine_is_assumed_slower_than_calibrated_until_live_steps_say() -> None:
    on_cpu = CapacityModel(info(), AdmissionConfig())
    on_gpu = CapacityModel(replace(info(), device="cuda:0"), AdmissionConfig())
    assert on_cpu.realtime_factor() == pytest.approx(1.4)  # the edge shares its cores
    assert on_gpu.realtime_factor() == pytest.approx(1.0)  # the calibration's jitter alone
    assert on_cpu.max_streams() < on_gpu.max_streams() == 12
    configured = AdmissionConfig(unmeasured_factor=2.0)
    assert CapacityModel(info(), configured).realtime_factor() == 2.0
    remembered = CapacityModel(info(), AdmissionConfig(), remembered=RememberedFactor(1.2, 0.0))
    assert remembered.realtime_factor() == pytest.approx(1.2)  # measured beats assumed
    for _ in range(9):  # three windows of live reports at the calibrated speed
        on_cpu.observe(timed_stats(1.0))
    # an assumption, not a verdict: live windows replace it as soon as there are three...
    assert on_cpu.realtime_factor() == pytest.approx(1.0) and on_cpu.realtime_limit() == 12
    # ...and the claim rises to it as fast as the load proves it: steps measured at 4
    # streams vouch for 10 % more than 4, not for 12 (the claim at the prior, 8, stands)
    assert on_cpu.max_streams() == 8
    on_cpu.observe(replace(timed_stats(1.0), stats=replace(engine_stats(), num_running=8)))
    assert on_cpu.max_streams() == 9
    assert on_cpu.refusal(Load(9, 0), StreamCost(10, 3.0)) == "realtime_budget"
    on_cpu.observe(replace(timed_stats(1.0), stats=replace(engine_stats(), num_running=11)))
    assert on_cpu.max_streams() == 12
    assert on_cpu.refusal(Load(9, 0), StreamCost(10, 3.0)) is None


def test_the_realtime_bound_is_the_calibrated_engine_alone_without_margins() -> None:
    # 1 ms per stream: 13 streams fit a 13.3 ms frame, 12 the 12 ms budget (10 % headroom).
    model = CapacityModel(info(max_num_seqs=4), AdmissionConfig())
    assert model.realtime_bound() == 13
    assert model.realtime_limit() == 4  # max_num_seqs caps the limit, not the bound
    for _ in range(10):
        model.observe(timed_stats(2.0))  # live steps twice as slow move the limit only
    assert model.realtime_factor() == pytest.approx(2.0)
    assert model.realtime_bound() == 13
    assert model.short_context_tokens == 400  # the calibration's points: 400 per stream
    costly = CapacityModel(
        replace(info(), calibration=replace(info().calibration, model=replace(
            info().calibration.model, per_kilocontext_ms=1.0))),
        AdmissionConfig(),
    )  # fmt: skip
    # 1 ms more per 1,000 positions past the points' 400 per stream: the nominal stream's
    # 823 positions cost 1.42 ms a stream (9 fit), the short streams' 400 still 1 ms (13).
    assert costly.realtime_bound() == 9
    assert costly.realtime_bound(costly.short_context_tokens) == 13
    uncalibrated = CapacityModel(info(calibrated=False), AdmissionConfig())
    assert uncalibrated.realtime_bound() == 0 and uncalibrated.short_context_tokens == 0
    assert uncalibrated.bounds() is None


def test_replicas_sharing_every_core_share_the_bounds_one_measured() -> None:
    calibrated = replace(info(), calibration=replace(info().calibration, throughput_streams=9.0))
    alone = CapacityModel(calibrated, AdmissionConfig())
    assert alone.bounds() == {
        "throughput_streams": 9.0, "long_context_throughput_streams": 0.0,
        "realtime_streams": 13, "realtime_short_context_streams": 13,
    }  # fmt: skip
    sharing = CapacityModel(calibrated, AdmissionConfig(), core_sharers=2)
    halves = sharing.bounds()
    assert halves is not None
    assert halves["throughput_streams"] == 4.5 and halves["realtime_streams"] == 6.5


def test_the_calibrations_jitter_counts_before_live_steps_do() -> None:
    calibrated = info()
    assert calibrated.calibration is not None
    jittery = replace(calibrated, calibration=replace(calibrated.calibration, jitter=1.5))
    model = CapacityModel(jittery, AdmissionConfig())
    assert model.realtime_limit() == 8  # 12 ms / 1.5


def test_replicas_sharing_the_cores_count_each_step_as_slow_as_all_busy() -> None:
    model = CapacityModel(info(), AdmissionConfig(), core_sharers=2)
    assert model.realtime_factor() == pytest.approx(2.0)
    assert model.realtime_limit() == 6  # 12 ms / 2
    for _ in range(5):  # fast live steps (the other replica idle) do not lift the floor
        model.observe(timed_stats(0.5))
    assert model.realtime_factor() == pytest.approx(2.0)


def _with_prompt_rows(ms_per_row: float, multiple: float = 8.0) -> CapacityModel:
    """The example engine with prompt rows of ``ms_per_row``, no prior slower than calibrated."""
    calibrated = info()
    assert calibrated.calibration is not None
    step_model = replace(calibrated.calibration.model, prefill_ms_per_token=ms_per_row)
    plan = replace(calibrated.realtime, prompt_ttfa_multiple=multiple)
    engine = replace(
        calibrated, calibration=replace(calibrated.calibration, model=step_model), realtime=plan
    )
    return CapacityModel(engine, AdmissionConfig(unmeasured_factor=1.0))


def _decoding(streams: int, prompt: int = 67) -> Load:
    """``streams`` streams admitted a while ago (their prompts long done, all decoding)."""
    running = tuple(RunningStream(5.0, prompt, 823) for _ in range(streams))
    return Load(streams, 0, 823, 400, running)


def test_a_prompt_is_admitted_only_if_it_can_be_prefilled_by_its_deadline() -> None:
    model = _with_prompt_rows(0.1)
    # 5 streams decoding: 5 ms of the 12 ms budget a step, so 7 ms of each 13.3 ms period
    # goes to prompts (0.525 of the engine). A nominal prompt (66 rows, 6.6 ms) is due by the
    # TTFA target (300 ms) less its first chunk's 15 steps (at 6 streams' 6 ms: 90 ms).
    assert model.prefill_lateness_s(_decoding(5), StreamCost(10, 3.0, 66)) < 0
    assert model.refusal(_decoding(5), StreamCost(10, 3.0, prompt_tokens=66)) is None
    # A 2,000-row prompt takes 200 ms alone, 381 ms at that share; it is due 8 x 193 ms
    # later than a nominal one (prompt_ttfa_multiple): it fits too.
    assert model.refusal(_decoding(5), StreamCost(10, 3.0, prompt_tokens=2000)) is None
    # Without that allowance, a long prompt must start within the TTFA target like any other.
    strict = _with_prompt_rows(0.1, multiple=0.0)
    long = StreamCost(10, 3.0, prompt_tokens=2000)
    assert strict.refusal(_decoding(5), long) == "prefill_budget"
    assert strict.prefill_lateness_s(_decoding(5), long) == pytest.approx(0.381 - 0.210, abs=0.01)
    # An idle replica always admits one, however long its prompt.
    assert strict.refusal(Load(0, 0), StreamCost(10, 3.0, prompt_tokens=10**6)) is None
    # Running streams well ahead of their listeners lend their lead at once.
    strict.observe(replace(stats(), stats=engine_stats(spare_lead_s=0.2)))
    assert strict.refusal(_decoding(5), long) is None
    strict.observe(stats())  # no playing streams reported: nothing lent
    assert strict.refusal(_decoding(5), long) == "prefill_budget"


def test_prompts_admitted_just_before_count_until_they_are_expected_done() -> None:
    model = _with_prompt_rows(1.0, multiple=0.0)  # a nominal prompt: 66 ms
    just_now = tuple(RunningStream(0.0, 66, 823) for _ in range(3))
    wave = Load(3, 0, 823, 66, just_now)
    # Nothing decodes yet: the engine prefills back to back, 66 ms a prompt, the fourth done
    # at 264 ms, after its deadline (300 ms less four streams' first chunk: 60 ms).
    assert model.refusal(wave, StreamCost(10, 3.0, 66)) == "prefill_budget"
    later = Load(3, 0, 823, 66, tuple(replace(s, age_s=0.1) for s in just_now))
    assert model.refusal(later, StreamCost(10, 3.0, 66)) is None  # 100 ms of them done since


def test_a_short_prompt_goes_ahead_of_long_ones_due_later() -> None:
    model = _with_prompt_rows(0.1)
    # Six 1,000-row prompts just admitted (100 ms each alone, due 8 x 93 ms later than the
    # TTFA target): the engine prefills a short prompt first, by its sooner deadline.
    longs = tuple(RunningStream(0.0, 1000, 1800) for _ in range(6))
    wave = Load(6, 0, 1800, 1000, longs)
    assert model.refusal(wave, StreamCost(10, 3.0, prompt_tokens=40)) is None
    assert model.prefill_burst(wave) > 0

    # About prompt_ttfa_multiple of them arriving together all start on time: beside eight,
    # a ninth still does; beside nine, a tenth would finish after its own deadline and waits
    # (or is refused) instead.
    def pending(count: int) -> Load:
        return Load(count, 0, 1800, 1000, (RunningStream(0.0, 1000, 1800),) * count)

    assert model.refusal(pending(8), StreamCost(10, 3.0, prompt_tokens=1000)) is None
    crowded = pending(9)
    assert model.refusal(crowded, StreamCost(10, 3.0, prompt_tokens=1000)) == "prefill_budget"


def test_kv_memory_and_max_num_seqs_limit_too() -> None:
    model = CapacityModel(info(kv_pages=200, max_num_seqs=3), AdmissionConfig())
    nominal = model.stream_cost("x" * 64, 10.0)
    assert model.kv_limit() == 200 // nominal.kv_pages
    assert model.max_streams() == min(model.kv_limit(), 3)
    assert model.refusal(Load(0, 190), StreamCost(20, 1.0)) == "kv_memory"
    assert model.refusal(Load(3, 0), StreamCost(1, 1.0)) in ("max_streams", "realtime_budget")


def test_stream_cost_counts_prompt_and_output_pages() -> None:
    model = CapacityModel(info(), AdmissionConfig())
    cost = model.stream_cost("a" * 100, 2.0)
    # 100 text bytes + 2 overhead + (150 frames + 7 delay) steps = 259 tokens -> 17 pages of 16,
    # exactly what the engine reserves for cadenza-tiny (tests/unit/engine/test_engine.py).
    assert cost == StreamCost(17, 2.0, prompt_tokens=102, final_context=259)
    assert model.stream_cost("a" * 100, 2.0, prompt_audio_s=1.0).kv_pages == 21  # + 75 frames
    assert model.stream_cost("é" * 50, 2.0).kv_pages == 17  # UTF-8 bytes, not characters


def test_slipping_deadlines_close_admission_until_slack_recovers() -> None:
    clock = Clock()
    config = AdmissionConfig(slack_close_ms=30.0, slack_reopen_s=2.0)
    model = CapacityModel(info(), config, clock=clock)
    model.observe(stats(slack_ms=[120.0, 80.0]))
    assert model.admission_open
    model.observe(stats(slack_ms=[120.0, 10.0]))  # one chunk nearly late
    assert not model.admission_open
    assert model.refusal(Load(2, 0), StreamCost(1, 1.0)) == "deadlines_slipping"
    assert model.refusal(Load(0, 0), StreamCost(1, 1.0)) is None  # an idle server always admits one
    clock.now = 1.0
    model.observe(stats(slack_ms=[150.0]))
    assert not model.admission_open
    clock.now = 2.5
    assert model.admission_open


def test_uncalibrated_engines_admit_by_memory_and_slots_only() -> None:
    model = CapacityModel(info(calibrated=False, max_num_seqs=7), AdmissionConfig())
    assert model.realtime_limit() == 7
    assert model.max_streams() == 7
    assert model.rtf_headroom(0) == pytest.approx(1.0)


def _costly(decodes_padded: bool) -> CapacityModel:
    """1 ms a stream at 400 positions, 1 ms more per 1,000 positions beyond; prompt rows
    0.01 ms each."""
    base = info()
    assert base.calibration is not None
    step_model = replace(base.calibration.model, per_kilocontext_ms=1.0, prefill_ms_per_token=0.01)
    calibration = replace(base.calibration, model=step_model)
    engine = replace(base, calibration=calibration, decodes_padded=decodes_padded)
    return CapacityModel(engine, AdmissionConfig(unmeasured_factor=1.0))


def test_an_engine_that_reads_each_streams_own_context_is_claimed_on_staggered_streams() -> None:
    padded, own = _costly(True), _costly(False)
    nominal = padded.nominal_context_tokens
    assert padded.nominal_contexts(10) == 10 * nominal
    # Started evenly one after another: the oldest near its end, the newest near its start
    # (each up to 1.5 s of lead ahead), never past the nominal context.
    contexts = own.nominal_contexts(10)
    assert 5 * nominal < contexts < 10 * nominal
    assert own.nominal_contexts(1) == nominal
    # 8 padded streams fit 12 ms (1.42 ms each); staggered, 10 (11.8 ms).
    assert padded.realtime_limit() == 8
    assert own.realtime_limit() == 10
    assert own.max_streams() == 10
    assert own.realtime_bound() > padded.realtime_bound()
    # An explicit context per stream is every stream at it, padded or not.
    assert own.realtime_limit(400) == padded.realtime_limit(400) == 12


def _running(ages: list[float], final: int = 823, prompt: int = 67) -> tuple:
    from cadenza.edge.admission.capacity import RunningStream

    return tuple(RunningStream(age, prompt, final) for age in ages)


def test_the_peak_check_sums_every_stream_alive_at_every_end() -> None:
    """The per-stream real-time check, written for speed (a storm of arrivals asks it many
    times over), agrees with its definition: every stream's context summed at each moment a
    stream ends, over the streams still alive then."""
    import random

    own = _costly(False)
    assert own.step_model is not None
    budget = own.step_budget_ms / own.realtime_factor()
    rng = random.Random(7)
    verdicts = set()

    def alive_at(moment: float, streams: list, ends: list[float]) -> list:
        return [s for s, end in zip(streams, ends, strict=True) if end >= moment]

    for _ in range(300):
        running = tuple(
            RunningStream(rng.choice([0.0, 0.5, rng.uniform(0, 12)]), 67, rng.randrange(200, 900))
            for _ in range(rng.randrange(0, 16))
        )
        cost = StreamCost(10, 5.0, prompt_tokens=67, final_context=rng.randrange(200, 900))
        streams = [*running, RunningStream(0.0, cost.prompt_tokens, cost.final_context)]
        rate = own.steps_per_second
        ends = [max((s.final_context - s.prompt_tokens) / rate - s.age_s, 0.0) for s in streams]
        expected = all(
            own.step_model.predict_ms(
                len(alive_at(moment, streams, ends)),
                sum(own._context_in(s, moment) for s in alive_at(moment, streams, ends)),
            )
            <= budget
            for moment in ends
        )
        assert own._peaks_fit(running, cost) == expected
        verdicts.add(expected)
    assert verdicts == {True, False}


def test_the_nominal_step_curve_follows_the_nominal_stream() -> None:
    own = _costly(False)
    before = own.realtime_limit()
    own.config = own.config.model_copy(update={"nominal_stream_s": 3 * own.config.nominal_stream_s})
    assert own.realtime_limit() < before  # longer nominal streams attend more: fewer fit


def test_admission_follows_each_stream_to_its_end_when_the_engine_does_not_pad() -> None:
    own, padded = _costly(False), _costly(True)
    new = StreamCost(10, 10.0, prompt_tokens=67, final_context=823)
    # Nine streams started one second apart: their contexts peak well below nine full ones.
    staggered = _running([float(k) for k in range(9)])
    load = Load(9, 0, longest_final_context=823, longest_context_now=400, running=staggered)
    assert own.refusal(load, new) is None
    assert padded.refusal(load, new) == "realtime_budget"  # ten at 823 positions each
    # Nine that started together all reach their final context together: refused.
    together = Load(9, 0, longest_final_context=823, longest_context_now=67,
                    running=_running([0.0] * 9))  # fmt: skip
    assert own.refusal(together, new) == "realtime_budget"
    # A stream still admitted past its modeled end still runs: it counts, at its final
    # context, until it is released.
    late = Load(9, 0, longest_final_context=823, longest_context_now=400,
                running=_running([30.0] * 9))  # fmt: skip
    assert own.refusal(late, new) == "realtime_budget"
    assert own.refusal(Load(4, 0, running=_running([30.0] * 4)), new) is None


def test_steps_right_after_the_engine_rested_do_not_count_against_the_model() -> None:
    from cadenza.contract.engine_stats import StepRecord, StepReport
    from cadenza.contract.messages import Stats
    from tests.support.contract_examples import engine_stats

    model = CapacityModel(info(), AdmissionConfig())
    cold = StepRecord(0.004 * 3.0, 4, 4, 400, rested_s=0.5)  # 3x the model, after a rest
    warm = StepRecord(0.004, 4, 4, 400)
    for _ in range(10):
        model.observe(Stats(engine_stats(), StepReport(steps=(cold,) * 20 + (warm,) * 20)))
    assert model.realtime_factor() == pytest.approx(1.0)
    for _ in range(10):
        model.observe(Stats(engine_stats(), StepReport(steps=(cold._replace(rested_s=0.0),) * 20)))
    assert model.realtime_factor() == pytest.approx(3.0)


def test_the_codecs_chunks_are_spread_over_the_steps_whose_frames_they_decoded() -> None:
    from cadenza.contract.engine_stats import StepRecord, StepReport
    from cadenza.contract.messages import Stats
    from tests.support.contract_examples import engine_stats

    model = CapacityModel(info(), AdmissionConfig())
    # 4 streams, 4 ms a step as calibrated, of which the codec's share is 1 ms (0.25 ms a
    # frame): the engine decodes it in one 10-step chunk, so one step in ten takes 13 ms.
    plain = StepRecord(0.003, 4, 4, 400)
    chunk = StepRecord(0.013, 4, 4, 400, codec_s=0.010)
    lumpy = [(plain,) * 9 + (chunk,), (plain,) * 19 + (chunk,) * 2, (plain,) * 20]
    for steps in lumpy * 4:  # some reports catch two chunks, some none
        report = StepReport(steps=steps, codec_s=sum(s.codec_s for s in steps),
                            codec_frames=40 * sum(1 for s in steps if s.codec_s))  # fmt: skip
        model.observe(Stats(engine_stats(), report))
    assert model.realtime_factor() == pytest.approx(1.0)


def test_an_uncalibrated_engine_that_does_not_pad_admits_by_memory_and_slots() -> None:
    engine = replace(info(calibrated=False, max_num_seqs=3), decodes_padded=False)
    model = CapacityModel(engine, AdmissionConfig())
    cost = StreamCost(10, 3.0, prompt_tokens=67, final_context=823)
    assert model.refusal(Load(2, 0, running=_running([0.0, 1.0])), cost) is None
    assert model.refusal(Load(3, 0, running=_running([0.0, 1.0, 2.0])), cost) == "max_streams"


def _with_waves(*waves: WavePoint, headroom: float = 1.0) -> CapacityModel:
    """The example engine (prompt rows nearly free) with measured arrival waves, at factor
    1 (waves held to it times ``headroom``)."""
    calibrated = info()
    assert calibrated.calibration is not None
    step_model = replace(calibrated.calibration.model, prefill_ms_per_token=1e-4)
    calibration = replace(calibrated.calibration, model=step_model, waves=waves)
    return CapacityModel(
        replace(calibrated, calibration=calibration),
        AdmissionConfig(unmeasured_factor=1.0, wave_headroom=headroom),
    )


def test_streams_arriving_together_are_no_more_than_the_wave_that_held() -> None:
    # Measured: 4 at once held up to 1.5x slower steps, 8 at once up to 1.0x (span 0.6 s).
    model = _with_waves(WavePoint(4, 1.5, 0.5), WavePoint(8, 1.0, 0.6))
    assert model.wave_limit() == 8 and model.wave_limit(1.25) == 6
    young = tuple(RunningStream(0.1, 66, 823) for _ in range(7))
    wave = Load(7, 0, 823, 66, young)
    assert model.refusal(wave, StreamCost(10, 3.0, 66)) is None  # the eighth fits the wave
    eight = Load(8, 0, 823, 66, (*young, RunningStream(0.0, 66, 823)))
    assert model.refusal(eight, StreamCost(10, 3.0, 66)) == "arrival_wave"
    # A short hold: the ninth may start once the oldest has aged past the wave's span.
    assert model.wave_wait_s(eight) == pytest.approx(0.5)
    older = Load(8, 0, 823, 66, (*young[:-1], RunningStream(0.7, 66, 823), young[0]))
    assert model.refusal(older, StreamCost(10, 3.0, 66)) is None
    # What /v1/capacity calls arriving at once: the wave less the young streams.
    assert model.prefill_burst(Load()) == 8
    assert model.prefill_burst(wave) == 1


def test_a_slower_machine_shrinks_the_wave_it_admits() -> None:
    model = _with_waves(WavePoint(4, 1.5, 0.5), WavePoint(8, 1.0, 0.6))
    for _ in range(10):
        model.observe(timed_stats(1.5))
    assert model.realtime_factor() == pytest.approx(1.5)
    assert model.wave_limit() == 4
    four = Load(4, 0, 823, 66, tuple(RunningStream(0.0, 66, 823) for _ in range(4)))
    assert model.refusal(four, StreamCost(10, 3.0, 66)) == "arrival_wave"
    # Its span is longer too: 0.6 s x 1.5.
    assert model.wave_wait_s(four) == pytest.approx(0.9)


def test_waves_are_held_to_the_factor_with_the_storms_headroom() -> None:
    model = _with_waves(WavePoint(4, 1.5, 0.5), WavePoint(8, 1.0, 0.6), headroom=1.25)
    assert model.wave_factor() == pytest.approx(1.25)
    assert model.wave_limit() == 4 + math.floor((1.5 - 1.25) / 0.5 * 4)  # 6 where 8 at 1.0
    assert AdmissionConfig().wave_headroom == 1.25  # the default


def test_without_measured_waves_no_wave_limit_applies() -> None:
    model = _with_waves()
    assert model.wave_limit() is None
    crowd = Load(10, 0, 823, 66, tuple(RunningStream(0.0, 66, 823) for _ in range(10)))
    assert model.wave_wait_s(crowd) == 0.0


def test_a_model_whose_contexts_restart_is_claimed_with_their_prompts_prefilled() -> None:
    """Bark prefills each coarse window's prompt afresh: the rows a stream prefills per frame
    are part of every step its streams take, beside their decodes."""
    base = _costly(True)
    shape = replace(base.info.shape, max_context_tokens=1024, context_rows_per_frame=30.0)
    restarting = CapacityModel(
        replace(base.info, shape=shape), AdmissionConfig(unmeasured_factor=1.0)
    )
    assert restarting.realtime_limit() < base.realtime_limit()
    rows_per_step = 30.0 / shape.steps_per_frame
    row_ms = base.step_model.prefill_ms(1, 512)  # type: ignore[union-attr]
    assert restarting.restart_ms_per_stream == pytest.approx(rows_per_step * row_ms)
    added = restarting._nominal_step_ms(3) - base._nominal_step_ms(3)
    assert added == pytest.approx(3 * rows_per_step * row_ms)
    # Every judgement of real time counts them: explicit contexts, the admission gate.
    assert restarting.realtime_limit(400) < base.realtime_limit(400)
    assert restarting.realtime_bound(400) < base.realtime_bound(400)
    # A stream holds one context's pages at most, however long it speaks.
    assert shape.pages(300, 100_000) == -(-1024 // shape.page_size)
