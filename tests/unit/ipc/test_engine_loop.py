"""The engine loop keeps serving past one request's failure and reports a failed step as fatal."""

from __future__ import annotations

import threading

import numpy as np
import zmq

from cadenza.config import load_config
from cadenza.contract import messages
from cadenza.contract.engine_stats import ProbeResult, StepReport
from cadenza.contract.request import FinishReason, StreamOutput, SynthesisRequest
from cadenza.engine.realtime import probe
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

    monkeypatch.setattr(cadenza.engine.builder, "build_serving_engine", lambda c: _FailingStep())
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
        assert isinstance(messages.decode(from_engine.recv()), messages.Ready)
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
