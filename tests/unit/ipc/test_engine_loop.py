"""The engine loop keeps serving past one request's failure and reports a failed step as fatal."""

from __future__ import annotations

import threading
import time

import numpy as np
import zmq

from cadenza.config import load_config
from cadenza.contract import messages
from cadenza.contract.engine_stats import STATS_INTERVAL_S, ProbeResult, StepReport
from cadenza.contract.request import FinishReason, StreamOutput, SynthesisRequest
from cadenza.engine.realtime import probe, remeasure
from cadenza.ipc.engine_side import engine_loop
from tests.support.contract_examples import engine_info


class _Outbound:
    def __init__(self) -> None:
        self.sent: list[messages.Message] = []

    def send(self, data: bytes) -> None:
        self.sent.append(messages.decode(data))


class _BrokenIntake:
    """An engine whose ``add_request`` fails with a bug, not a refusal."""

    def __init__(self) -> None:
        self.added: list[str] = []

    def add_request(self, request: SynthesisRequest) -> None:
        if request.text == "boom":
            raise KeyError("a bug")
        self.added.append(request.request_id)


def test_a_request_that_fails_to_add_is_rejected_and_the_loop_goes_on() -> None:
    engine = _BrokenIntake()
    outbound = _Outbound()
    for request_id, text in [("bad", "boom"), ("good", "hello")]:
        add = messages.AddRequest(SynthesisRequest(request_id, text))
        assert engine_loop._handle(engine, add, outbound)  # type: ignore[arg-type]
    assert engine.added == ["good"]
    (rejected,) = outbound.sent
    assert isinstance(rejected, messages.Output) and rejected.request_id == "bad"
    assert rejected.error_code == "rejected" and "could not start" in (rejected.error or "")


class _FailingStep:
    info = engine_info()

    def __init__(self) -> None:
        self.pending = False

    def add_request(self, request: SynthesisRequest) -> None:
        self.pending = True

    def has_unfinished_requests(self) -> bool:
        return self.pending

    def idle_s(self) -> float:
        return 0.0

    def step(self) -> list[StreamOutput]:
        raise RuntimeError("corrupted state")


def test_a_step_that_raises_ends_the_loop_with_fatal(monkeypatch) -> None:
    import cadenza.engine.builder

    monkeypatch.setattr(
        cadenza.engine.builder, "build_serving_engine", lambda c, on_stage=None: _FailingStep()
    )
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    to_engine, from_engine = context.socket(zmq.PUSH), context.socket(zmq.PULL)
    to_engine.bind("inproc://loop-in")
    from_engine.bind("inproc://loop-out")
    loop = threading.Thread(
        target=engine_loop.run_engine_loop,
        args=(load_config(), context, "inproc://loop-in", "inproc://loop-out"),
        kwargs={"stop": threading.Event()},
    )
    loop.start()
    try:
        first = messages.decode(from_engine.recv())
        while isinstance(first, messages.Starting):  # its start, reported as it goes
            first = messages.decode(from_engine.recv())
        assert isinstance(first, messages.Ready)
        to_engine.send(messages.encode(messages.AddRequest(SynthesisRequest("r", "hi"))))
        assert from_engine.poll(10_000)
        fatal = messages.decode(from_engine.recv())
        assert isinstance(fatal, messages.Fatal) and "corrupted state" in fatal.message
        loop.join(10)
        assert not loop.is_alive()
    finally:
        to_engine.close(linger=0)
        from_engine.close(linger=0)
        context.term()


def test_rejection_outputs_carry_no_audio() -> None:
    outbound = _Outbound()
    engine_loop._reject("r", "why", outbound)  # type: ignore[arg-type]
    (output,) = outbound.sent
    assert isinstance(output, messages.Output)
    stream = output.stream_output()
    assert stream.finish_reason is FinishReason.ERROR and np.size(stream.audio) == 0


class _Probed:
    """An engine that records the probe asked of it (through :func:`_recorded_probe`)."""

    def __init__(self, busy: bool) -> None:
        self.busy = busy
        self.asked: list[tuple[int, float, bool]] = []

    def has_unfinished_requests(self) -> bool:
        return self.busy

    def stats(self) -> object:
        from tests.support.contract_examples import engine_stats

        return engine_stats()

    def take_report(self) -> StepReport:
        return StepReport()


def _recorded_probe(engine: _Probed, batch, max_ms, interrupted) -> ProbeResult:
    engine.asked.append((batch, max_ms, interrupted()))
    outcome = "busy" if engine.busy else "done"
    return ProbeResult(StepReport(), 0 if engine.busy else batch, outcome)


class _Inbound:
    def __init__(self, waiting: int) -> None:
        self.waiting = waiting

    def poll(self, timeout_ms: int) -> int:
        return self.waiting


def test_a_probe_sends_the_reports_before_it_then_its_own_steps(monkeypatch) -> None:
    monkeypatch.setattr(probe, "probe_engine", _recorded_probe)
    idle, outbound = _Probed(busy=False), _Outbound()
    engine_loop._probe(idle, messages.Probe(6, 250.0), _Inbound(1), outbound)  # type: ignore[arg-type]
    stats, probed = outbound.sent
    assert isinstance(stats, messages.Stats) and isinstance(probed, messages.Probed)
    assert (probed.batch, probed.outcome) == (6, "done")
    assert idle.asked == [(6, 250.0, True)]  # a waiting message interrupts it
    busy, outbound = _Probed(busy=True), _Outbound()
    engine_loop._probe(busy, messages.Probe(6, 250.0), _Inbound(0), outbound)  # type: ignore[arg-type]
    (probed,) = outbound.sent
    assert isinstance(probed, messages.Probed) and probed.outcome == "busy"


class _Queued:
    """An inbound socket holding ``waiting`` messages from the edge."""

    def __init__(self, waiting: list[messages.Message]) -> None:
        self.waiting = [messages.encode(m) for m in waiting]

    def poll(self, timeout_ms: int) -> int:
        return len(self.waiting)

    def recv(self) -> bytes:
        return self.waiting.pop(0)


def test_measuring_again_answers_probes_and_stops_for_anything_else(monkeypatch) -> None:
    """While an idle engine measures again, the edge hears stats as from an idle engine (its
    heartbeat), a probe it asks for is answered busy, and a request stops the sweep and goes
    back to the loop."""
    kept = engine_info().calibration
    assert kept is not None
    answers: list[bool] = []

    def sweep(engine: object, interrupted) -> remeasure.Remeasured:
        time.sleep(1.2 * STATS_INTERVAL_S)
        answers.append(interrupted())
        return remeasure.Remeasured("interrupted" if answers[-1] else "agreed", kept)

    monkeypatch.setattr(remeasure, "remeasure", sweep)
    add = messages.AddRequest(SynthesisRequest("r", "hi"))
    outbound = _Outbound()
    schedule = remeasure.RemeasureSchedule(30.0)
    inbound = _Queued([messages.Probe(4, 100.0), add])
    arrived = engine_loop._remeasure(_Probed(busy=False), inbound, outbound, schedule)  # type: ignore[arg-type]
    assert arrived == add and answers == [True]
    stats, probed = outbound.sent
    assert isinstance(stats, messages.Stats) and stats.report.steps == ()
    assert isinstance(probed, messages.Probed) and (probed.batch, probed.outcome) == (0, "busy")

    outbound = _Outbound()
    nothing = engine_loop._remeasure(_Probed(busy=False), _Queued([]), outbound, schedule)  # type: ignore[arg-type]
    assert nothing is None and answers[-1] is False
    assert isinstance(outbound.sent[-1], messages.Recalibrated)
    assert outbound.sent[-1].calibration == kept


class _Socket:
    def __init__(self) -> None:
        self.sent: list[messages.Message] = []

    def send(self, data: bytes, flags: int = 0) -> None:
        self.sent.append(messages.decode(data))


def test_a_starting_engine_reports_its_stage_and_cpu_time_until_it_is_built() -> None:
    outbound = _Socket()
    with engine_loop._StartupReports(outbound) as reports:  # type: ignore[arg-type]
        waited = time.monotonic()
        while not outbound.sent and time.monotonic() - waited < 0.5:
            time.sleep(0.01)
        assert [m.type for m in outbound.sent] == ["starting"]  # at once, not after a second
        reports.set_stage("calibrating (attempt 1 of 3)")
        started = time.process_time()
        while time.process_time() - started < 0.2 or len(outbound.sent) < 2:  # work, as it would
            sum(range(10_000))
    count = len(outbound.sent)
    time.sleep(1.2 * engine_loop.STARTUP_REPORT_S)
    assert len(outbound.sent) == count  # nothing more once it is built
    first, report = outbound.sent[0], outbound.sent[-1]
    assert isinstance(first, messages.Starting) and isinstance(report, messages.Starting)
    assert first.stage == "loading"
    assert report.stage == "calibrating (attempt 1 of 3)" and report.cpu_s > first.cpu_s
