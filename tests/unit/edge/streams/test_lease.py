"""One admission sequence and one stream lifecycle for every transport: :meth:`Admission.open`
refuses in the documented order (engine, validation, guard, rate limits, capacity) and gives
back what a late refusal charged; a :class:`StreamLease` counts its stream, settles the rate
limit with the audio produced and frees its slot exactly once, however the stream ends.

The engine is a fake (``require_ready`` and ``generate``); the gate, capacity model, rate
limiter, guard and metrics are the real ones. The rate limiter's clock stands still, so its
refill never blurs what a refusal's ``retry_after_s`` says about the bucket."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncGenerator, Sequence
from typing import Any

import numpy as np
import pytest

from cadenza.config import AdmissionConfig, CadenzaConfig, GuardConfig, LimitsConfig
from cadenza.contract.engine_info import EngineInfo
from cadenza.contract.errors import EngineError, EngineUnavailable
from cadenza.contract.request import FinishReason, StreamOutput, SynthesisRequest
from cadenza.edge.admission.capacity import CapacityModel
from cadenza.edge.admission.gate import AdmissionGate
from cadenza.edge.admission.guard import GuardVerdict, PhraseListGuard, TextGuard
from cadenza.edge.admission.rate_limit import RateLimiter
from cadenza.edge.admission.ticket import Ticket
from cadenza.edge.auth.principal import Principal
from cadenza.edge.server.metrics import Metrics
from cadenza.edge.server.model_metrics import ModelMetrics
from cadenza.edge.streams.admission_sequence import Admission
from cadenza.edge.streams.errors import EdgeError
from cadenza.edge.streams.lease import StreamLease, Transport
from tests.support.contract_examples import engine_info

RATE = 24000  # engine_info()'s sample rate
CLIENT = "client-a"


class FakeEngine:
    """``require_ready`` and ``generate`` of an engine client (and ``client_for`` of the
    model service: every replica is this one), scripted."""

    def __init__(
        self,
        seconds: Sequence[float] = (0.25,),
        finish: FinishReason | None = FinishReason.EOS,
        error: EngineError | None = None,
        info: EngineInfo | None = None,
    ) -> None:
        self.seconds = seconds
        self.finish = finish
        self.error = error
        self.info = info or engine_info(calibrated=False)
        self.unavailable: EngineUnavailable | None = None
        self.requests: list[SynthesisRequest] = []
        self.continuing: list[bool] = []  # each request's: a stream's next part?
        self.generators_closed = 0

    def require_ready(self) -> EngineInfo:
        if self.unavailable is not None:
            raise self.unavailable
        return self.info

    def client_for(self, replica: int | None) -> FakeEngine:
        return self

    async def generate(
        self, request: SynthesisRequest, continuing: bool = False
    ) -> AsyncGenerator[StreamOutput, None]:
        self.requests.append(request)
        self.continuing.append(continuing)
        try:
            for i, seconds in enumerate(self.seconds):
                last = i == len(self.seconds) - 1 and self.error is None
                yield StreamOutput(
                    request.request_id,
                    np.zeros(round(seconds * RATE), np.float32),
                    finish_reason=self.finish if last else None,
                )
            if self.error is not None:
                raise self.error
        finally:
            self.generators_closed += 1


class RecordingGuard:
    """Allows everything and remembers what it was asked."""

    name = "recording"

    def __init__(self) -> None:
        self.texts: list[str] = []

    async def check(self, text: str) -> GuardVerdict:
        self.texts.append(text)
        return GuardVerdict(True)


class BrokenGuard:
    name = "broken"

    async def check(self, text: str) -> GuardVerdict:
        raise RuntimeError("guard service down")


def build(
    engine: FakeEngine | None = None,
    *,
    guard: TextGuard | None = None,
    requests_per_minute: float = 0,
    audio_seconds_per_minute: float = 0,
    max_num_seqs: int = 4,
    kv_pages: int = 100_000,
    max_queue_length: int = 64,
    fail_open: bool = False,
) -> Admission:
    config = CadenzaConfig(
        limits=LimitsConfig(
            requests_per_minute=requests_per_minute,
            audio_seconds_per_minute=audio_seconds_per_minute,
        ),
        guard=GuardConfig(fail_open=fail_open),
        # Realtime requests may queue as long as a test's stream lasts (the default refuses a
        # listener who would wait past the TTFA target; tests/unit/edge/admission covers it).
        admission=AdmissionConfig(max_queue_length=max_queue_length, realtime_max_wait_s=30.0),
    )
    engine = engine or FakeEngine()
    engine.info = engine_info(kv_pages=kv_pages, max_num_seqs=max_num_seqs, calibrated=False)
    metrics = Metrics()
    capacity = CapacityModel(engine.info, config.admission)
    gate = AdmissionGate(config.admission, capacity, ModelMetrics(metrics, "cadenza-tiny"))
    limiter = RateLimiter(requests_per_minute, audio_seconds_per_minute, clock=lambda: 0.0)
    return Admission(config, engine, gate, limiter, guard, metrics)  # type: ignore[arg-type]


def request(text: str = "Hello.", **fields: Any) -> SynthesisRequest:
    return SynthesisRequest(request_id=f"r-{text[:8]}", text=text, **fields)


async def open_lease(
    admission: Admission,
    transport: Transport = "websocket",
    client: str = CLIENT,
    **fields: Any,
) -> StreamLease:
    model = fields.pop("model", None)
    return await admission.open(
        transport=transport,
        principal=principal_of(client),
        request=request(**fields),
        priority="realtime",
        model=model,
    )


def principal_of(client: str) -> Principal:
    return Principal(kind="stream_key", client=client, holder=client)


async def refusal(admission: Admission, **kwargs: Any) -> EdgeError:
    with pytest.raises(EdgeError) as caught:
        await open_lease(admission, **kwargs)
    return caught.value


async def drain(lease: StreamLease) -> list[StreamOutput]:
    outputs = []
    try:
        async for output in lease.outputs():
            outputs.append(output)
    finally:
        lease.close()
    return outputs


async def until(condition: Any) -> None:
    """Let other tasks run until ``condition()`` holds (a bounded number of turns)."""
    for _ in range(1000):
        if condition():
            return
        await asyncio.sleep(0)
    raise AssertionError("the condition never held")


def value(admission: Admission, name: str, **labels: str) -> float:
    sample = admission.metrics.registry.get_sample_value(name, labels)
    return 0.0 if sample is None else sample


def finished(admission: Admission, reason: str, transport: str = "websocket") -> float:
    return value(admission, "cadenza_streams_finished_total", reason=reason, transport=transport)


def count_releases(gate: AdmissionGate) -> list[Ticket]:
    released: list[Ticket] = []
    release = gate.release

    def counting(ticket: Ticket) -> None:
        released.append(ticket)
        release(ticket)

    gate.release = counting  # type: ignore[method-assign]
    return released


# -- the order of refusals --------------------------------------------------------------------


def test_an_unavailable_engine_is_refused_before_anything_else() -> None:
    async def scenario() -> None:
        engine = FakeEngine()
        guard = RecordingGuard()
        admission = build(engine, guard=guard, requests_per_minute=1)
        engine.unavailable = EngineUnavailable("engine is not ready", retry_after_s=5.0)
        error = await refusal(admission, voice="nobody", text="   ")
        assert (error.status, error.code) == (503, "engine_unavailable")
        assert error.retry_after_s == 5.0 and error.headers["Retry-After"] == "5"
        assert guard.texts == []
        assert value(admission, "cadenza_stream_requests_total", transport="websocket") == 1
        refusals = value(
            admission,
            "cadenza_stream_refusals_total",
            transport="websocket",
            code="engine_unavailable",
        )
        assert refusals == 1
        engine.unavailable = None
        (await open_lease(admission)).close()  # the refusal charged nothing

    asyncio.run(scenario())


@pytest.mark.parametrize(
    ("fields", "status", "code", "param"),
    [
        ({"model": "other-model"}, 400, "model_not_found", "model"),
        ({"voice": "nobody"}, 400, "voice_not_found", "voice"),
        ({"text": "  \n "}, 400, "empty_input", "input"),
        ({"text": "x" * 4097}, 400, "input_too_long", "input"),
        ({"max_duration_s": 0.0}, 400, "invalid_duration", "max_duration_s"),
        ({"max_duration_s": 301.0}, 400, "invalid_duration", "max_duration_s"),
    ],
)
def test_invalid_requests_are_refused_before_the_guard_runs_and_cost_nothing(
    fields: dict[str, Any], status: int, code: str, param: str
) -> None:
    async def scenario() -> None:
        guard = RecordingGuard()
        admission = build(guard=guard, requests_per_minute=1, audio_seconds_per_minute=1.0)
        error = await refusal(admission, **fields)
        assert (error.status, error.code, error.param) == (status, code, param)
        assert guard.texts == []
        assert not admission.gate.active
        lease = await open_lease(admission)
        assert guard.texts == ["Hello."]
        lease.close()

    asyncio.run(scenario())


def test_the_model_is_checked_only_when_the_protocol_names_one() -> None:
    async def scenario() -> None:
        admission = build()
        (await open_lease(admission, model="cadenza-tiny")).close()
        (await open_lease(admission, model=None)).close()

    asyncio.run(scenario())


def test_a_guard_refusal_costs_no_rate_limit_tokens() -> None:
    async def scenario() -> None:
        guard = PhraseListGuard(["forbidden words"])
        admission = build(guard=guard, requests_per_minute=1, audio_seconds_per_minute=1.0)
        error = await refusal(admission, text="These are FORBIDDEN\n  words.")
        assert (error.status, error.code, error.param) == (400, "content_refused", "input")
        assert error.message == "text contains a refused phrase"
        counted = value(
            admission,
            "cadenza_stream_refusals_total",
            transport="websocket",
            code="content_refused",
        )
        assert counted == 1
        lease = await open_lease(admission, text="Allowed words.")
        assert lease.request.text == "Allowed words."
        lease.close()

    asyncio.run(scenario())


@pytest.mark.parametrize(("fail_open", "admitted"), [(False, False), (True, True)])
def test_a_broken_guard_falls_back_to_the_configured_policy(
    fail_open: bool, admitted: bool
) -> None:
    async def scenario() -> None:
        admission = build(guard=BrokenGuard(), fail_open=fail_open)
        if admitted:
            (await open_lease(admission)).close()
        else:
            error = await refusal(admission)
            assert error.code == "content_refused"
            assert "guard service down" in error.message

    asyncio.run(scenario())


def test_a_spent_request_budget_is_429_with_retry_after() -> None:
    async def scenario() -> None:
        admission = build(requests_per_minute=1)
        await drain(await open_lease(admission))
        error = await refusal(admission)
        assert (error.status, error.code) == (429, "rate_limited")
        assert error.retry_after_s == pytest.approx(60.0)
        assert error.headers["Retry-After"] == "60"
        assert not admission.gate.active
        counted = value(
            admission, "cadenza_stream_refusals_total", transport="websocket", code="rate_limited"
        )
        assert counted == 1
        (await open_lease(admission, client="client-b")).close()  # budgets are per client

    asyncio.run(scenario())


def test_a_spent_audio_budget_is_429_with_the_wait_for_the_missing_seconds() -> None:
    async def scenario() -> None:
        # "Hello." asks for 1 s (the minimum duration); the bucket holds 1.5 s a minute.
        admission = build(FakeEngine(seconds=(1.0,)), audio_seconds_per_minute=1.5)
        await drain(await open_lease(admission))
        error = await refusal(admission)
        assert (error.status, error.code) == (429, "rate_limited")
        assert error.retry_after_s == pytest.approx(0.5 / (1.5 / 60))

    asyncio.run(scenario())


def test_a_full_queue_refusal_gives_the_charged_audio_back() -> None:
    async def scenario() -> None:
        admission = build(max_num_seqs=1, max_queue_length=0, audio_seconds_per_minute=1.0)
        held = await open_lease(admission, client="holder")
        error = await refusal(admission)
        assert (error.status, error.code) == (503, "queue_full")
        assert error.retry_after_s is not None and error.retry_after_s >= 1.0
        held.close()
        # The whole 1 s minute's budget is back: the same request fits again.
        (await open_lease(admission)).close()

    asyncio.run(scenario())


def test_a_request_that_can_never_fit_is_400_too_large_and_gives_the_audio_back() -> None:
    async def scenario() -> None:
        admission = build(kv_pages=2, audio_seconds_per_minute=1.0)
        for _ in range(2):
            error = await refusal(admission)
            assert (error.status, error.code, error.param) == (400, "too_large", "max_duration_s")
            assert error.retry_after_s is None

    asyncio.run(scenario())


def test_a_capacity_refusal_gives_the_request_token_back() -> None:
    async def scenario() -> None:
        admission = build(max_num_seqs=1, max_queue_length=0, requests_per_minute=1)
        held = await open_lease(admission, client="holder")
        assert (await refusal(admission)).code == "queue_full"
        held.close()
        (await open_lease(admission)).close()

    asyncio.run(scenario())


def test_a_client_that_leaves_while_queued_gets_its_audio_back() -> None:
    async def scenario() -> None:
        admission = build(max_num_seqs=1, audio_seconds_per_minute=1.0)
        held = await open_lease(admission, client="holder")
        positions: list[int] = []

        async def on_queued(position: int, wait_s: float) -> None:
            positions.append(position)

        waiting = asyncio.create_task(
            admission.open(
                transport="http",
                principal=principal_of(CLIENT),
                request=request(),
                priority="standard",
                on_queued=on_queued,
            )
        )
        await until(lambda: positions)
        assert positions == [1]
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        held.close()
        assert not admission.gate.active and not admission.gate.queues
        (await open_lease(admission)).close()

    asyncio.run(scenario())


def test_a_queued_request_gets_the_slot_when_the_stream_ahead_ends() -> None:
    async def scenario() -> None:
        admission = build(max_num_seqs=1)
        held = await open_lease(admission, client="holder")
        waiting = asyncio.create_task(open_lease(admission))
        await until(lambda: admission.gate.queues)
        await drain(held)
        lease = await asyncio.wait_for(waiting, 5)
        assert lease.queued_s >= 0 and len(admission.gate.active) == 1
        lease.close()
        assert not admission.gate.active

    asyncio.run(scenario())


# -- the stream -------------------------------------------------------------------------------


@pytest.mark.parametrize("transport", ["http", "websocket", "webrtc"])
def test_a_finished_stream_is_counted_settled_and_released_once(transport: Transport) -> None:
    async def scenario() -> None:
        engine = FakeEngine(seconds=(0.0, 0.1, 0.15), finish=FinishReason.EOS)
        admission = build(engine, audio_seconds_per_minute=1.0)
        released = count_releases(admission.gate)
        lease = await open_lease(admission, transport=transport)
        assert value(admission, "cadenza_streams_active") == 1
        assert lease.queued_s == 0 and lease.sample_rate == RATE and not lease.ended
        assert engine.requests == []  # nothing reaches the engine before outputs()
        outputs = []
        async for output in lease.outputs():
            outputs.append(output)
            if output.finished:  # the slot is free before the last audio is sent
                assert lease.ended and not admission.gate.active
        assert [len(o.audio) for o in outputs] == [0, 2400, 3600]
        assert lease.audio_s == pytest.approx(0.25)
        assert engine.generators_closed == 1
        assert value(admission, "cadenza_streams_active") == 0
        assert value(
            admission, "cadenza_audio_seconds_total", transport=transport
        ) == pytest.approx(0.25)
        ttfa = value(admission, "cadenza_time_to_first_audio_seconds_count", transport=transport)
        assert ttfa == 1
        assert finished(admission, "eos", transport) == 1
        lease.close()  # after the end: a no-op
        lease.close()
        assert len(released) == 1
        assert value(admission, "cadenza_streams_active") == 0
        assert finished(admission, "eos", transport) == 1
        assert finished(admission, "cancelled", transport) == 0
        for other in {"http", "websocket", "webrtc"} - {transport}:
            assert value(admission, "cadenza_audio_seconds_total", transport=other) == 0
        # Settled with the 0.25 s produced: 0.75 s of the 1 s bucket came back.
        error = await refusal(admission)
        assert error.code == "rate_limited"
        assert error.retry_after_s == pytest.approx(0.25 * 60)

    asyncio.run(scenario())


def test_the_finish_reason_is_the_one_the_engine_gives() -> None:
    async def scenario() -> None:
        admission = build(FakeEngine(finish=FinishReason.LENGTH))
        await drain(await open_lease(admission))
        assert finished(admission, "length") == 1 and finished(admission, "eos") == 0

    asyncio.run(scenario())


def test_an_immediately_finished_stream_still_counts_its_time_to_first_audio() -> None:
    async def scenario() -> None:
        admission = build(FakeEngine(seconds=(0.0,)))
        await drain(await open_lease(admission))
        count = value(admission, "cadenza_time_to_first_audio_seconds_count", transport="websocket")
        assert count == 1

    asyncio.run(scenario())


@pytest.mark.parametrize(
    ("error", "status", "code"),
    [
        (EngineError("model blew up", "internal"), 500, "engine_internal"),
        (EngineError("unknown voice", "rejected"), 400, "engine_rejected"),
        (EngineError("fell behind", "slow_consumer"), 408, "slow_consumer"),
        (EngineUnavailable("engine crashed", retry_after_s=7.0), 503, "engine_unavailable"),
    ],
)
def test_an_engine_failure_becomes_an_edge_error_and_ends_the_lease(
    error: EngineError, status: int, code: str
) -> None:
    async def scenario() -> None:
        engine = FakeEngine(seconds=(0.1,), error=error)
        admission = build(engine, audio_seconds_per_minute=1.0)
        released = count_releases(admission.gate)
        lease = await open_lease(admission)
        received = []
        with pytest.raises(EdgeError) as caught:
            async for output in lease.outputs():
                received.append(output)
        assert (caught.value.status, caught.value.code) == (status, code)
        assert caught.value.message == str(error)
        assert len(received) == 1 and lease.ended and lease.audio_s == pytest.approx(0.1)
        assert finished(admission, "error") == 1
        assert value(admission, "cadenza_streams_active") == 0
        assert not admission.gate.active and len(released) == 1
        lease.close()
        assert len(released) == 1 and finished(admission, "cancelled") == 0
        settled = await refusal(admission)
        assert settled.retry_after_s == pytest.approx(0.1 * 60)

    asyncio.run(scenario())


def test_closing_before_the_engine_finishes_is_a_cancellation() -> None:
    async def scenario() -> None:
        engine = FakeEngine(seconds=(0.1, 0.2, 0.3))
        admission = build(engine, audio_seconds_per_minute=1.0)
        released = count_releases(admission.gate)
        lease = await open_lease(admission, transport="webrtc")
        outputs = lease.outputs()
        first = await anext(outputs)
        assert not first.finished and not lease.ended
        assert value(admission, "cadenza_streams_active") == 1
        await outputs.aclose()  # what a transport does when its client leaves
        assert engine.generators_closed == 1  # the engine request is aborted
        lease.close()
        assert lease.ended and len(released) == 1 and not admission.gate.active
        assert finished(admission, "cancelled", "webrtc") == 1
        assert value(admission, "cadenza_streams_active") == 0
        lease.close()
        assert len(released) == 1 and finished(admission, "cancelled", "webrtc") == 1
        # Settled with the 0.1 s produced before the cancel.
        error = await refusal(admission)
        assert error.retry_after_s == pytest.approx(0.1 * 60)

    asyncio.run(scenario())


def test_closing_a_lease_that_never_streamed_settles_everything() -> None:
    async def scenario() -> None:
        engine = FakeEngine()
        admission = build(engine, audio_seconds_per_minute=1.0)
        lease = await open_lease(admission)
        lease.close()
        assert engine.requests == [] and not admission.gate.active
        assert finished(admission, "cancelled") == 1
        assert value(admission, "cadenza_streams_active") == 0
        (await open_lease(admission)).close()  # the whole second came back

    asyncio.run(scenario())


def test_streams_active_counts_every_open_lease() -> None:
    async def scenario() -> None:
        admission = build(max_num_seqs=4)
        leases = [await open_lease(admission, client=f"c{i}") for i in range(3)]
        assert value(admission, "cadenza_streams_active") == 3
        assert len(admission.gate.active) == 3
        for lease in leases:
            lease.close()
        assert value(admission, "cadenza_streams_active") == 0
        assert finished(admission, "cancelled") == 3

    asyncio.run(scenario())


# -- engine losses ------------------------------------------------------------------------------


class LosingEngine(FakeEngine):
    """Every replica is this one. The first run sends one output (two rows, two frames),
    then loses its replica (the gate orphans the stream, the replica comes back at once); the
    next runs finish."""

    def __init__(self, restarts: bool = True) -> None:
        super().__init__()
        self.gate: AdmissionGate | None = None
        self.restarts = restarts

    async def generate(
        self, request: SynthesisRequest, continuing: bool = False
    ) -> AsyncGenerator[StreamOutput, None]:
        self.requests.append(request)
        if len(self.requests) > 1:
            yield StreamOutput(
                request.request_id, np.zeros(RATE // 10, np.float32), FinishReason.EOS
            )
            return
        yield StreamOutput(
            request.request_id,
            np.zeros(RATE // 10, np.float32),
            codes=np.zeros((2, 4), np.uint16),
            rows=np.array([[5], [6]], np.int32),
        )
        assert self.gate is not None
        capacity = self.gate.replicas[0]
        self.gate.replica_lost(0)
        if self.restarts:
            self.gate.set_replica(0, capacity)
        raise EngineUnavailable("engine process exited")


def test_a_stream_whose_engine_is_lost_resumes_where_it_stood() -> None:
    async def scenario() -> None:
        engine = LosingEngine()
        admission = build(engine=engine)
        engine.gate = admission.gate
        lease = await open_lease(admission)
        outputs = await drain(lease)
        assert [o.finish_reason for o in outputs] == [None, FinishReason.EOS]
        resumed = engine.requests[1]
        assert resumed.resume is not None
        assert resumed.resume.rows == ((5,), (6,)) and resumed.resume.frames_sent == 2
        assert lease.resumes == 1 and finished(admission, "eos") == 1
        assert not admission.gate.active
        resumes = admission.model_metrics.stream_resumes.labels(outcome="resumed")
        assert resumes._value.get() == 1

    asyncio.run(scenario())


def test_a_stream_no_replica_takes_in_time_fails_with_engine_unavailable() -> None:
    async def scenario() -> None:
        engine = LosingEngine(restarts=False)
        admission = build(engine=engine)
        admission.config = admission.config.model_copy(
            update={"server": admission.config.server.model_copy(update={"resume_timeout_s": 0.05})}
        )
        engine.gate = admission.gate
        lease = await open_lease(admission)
        with pytest.raises(EdgeError) as failed:
            await drain(lease)
        assert failed.value.code == "engine_unavailable" and failed.value.status == 503
        assert "no replica could take it over" in failed.value.message
        assert finished(admission, "error") == 1 and not admission.gate.active

    asyncio.run(scenario())


def test_a_text_streams_next_segment_needs_no_fresh_heartbeat_its_first_does() -> None:
    """A segment after the first goes to the engine already serving the stream as its
    continuation (a long step there is work, not a hang); the first is a new stream."""

    async def scenario() -> list[bool]:
        engine = FakeEngine(seconds=(0.1,), finish=FinishReason.EOS)
        lease = await open_lease(build(engine))
        for index, text in enumerate(("One.", "Two.")):
            lease.speak_next(dataclasses.replace(lease.request, request_id=f"s{index}", text=text))
            assert [o.finish_reason async for o in lease.outputs()][-1] is FinishReason.EOS
        lease.finish("eos")
        return engine.continuing

    assert asyncio.run(scenario()) == [False, True]
