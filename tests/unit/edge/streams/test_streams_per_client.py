"""``limits.max_streams_per_client`` in the admission sequence: a holder's stream over the
limit is refused with 429 ``too_many_streams`` before it costs anything, and a stream's place
comes back however it ends (done, cancelled, its engine failed or lost, a text stream
finished) or however it is refused after it was counted. A resumed stream counts too, once.

The admission is test_lease's (a fake engine, the real gate, rate limiter and guard) with this
node's count of open streams."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import numpy as np
import pytest

from cadenza.contract.errors import EngineError, EngineUnavailable
from cadenza.edge.admission.client_streams import NodeStreams
from cadenza.edge.auth.principal import Principal
from cadenza.edge.streams.admission_sequence import Admission
from cadenza.edge.streams.errors import EdgeError
from cadenza.edge.streams.lease import StreamLease
from tests.unit.edge.streams.test_lease import (
    CLIENT,
    BrokenGuard,
    FakeEngine,
    RecordingGuard,
    build,
    drain,
    open_lease,
    refusal,
    request,
    until,
    value,
)


def limited(admission: Admission, limit: int = 1) -> NodeStreams:
    streams = NodeStreams(limit)
    admission.client_streams = streams
    return streams


def test_a_stream_over_the_limit_is_429_before_the_guard_and_the_rate_limits() -> None:
    async def scenario() -> None:
        guard = RecordingGuard()
        admission = build(guard=guard, requests_per_minute=2)
        streams = limited(admission)
        held = await open_lease(admission, text="One.")
        error = await refusal(admission, text="Two.")
        assert (error.status, error.code) == (429, "too_many_streams")
        assert error.retry_after_s is None and "max_streams_per_client" in error.message
        assert guard.texts == ["One."]  # refused before the guard ran
        refusals = value(
            admission,
            "cadenza_stream_refusals_total",
            transport="websocket",
            code="too_many_streams",
        )
        assert refusals == 1
        (await open_lease(admission, client="someone-else", text="Three.")).close()
        held.close()
        assert streams.count(CLIENT) == 0
        (await open_lease(admission, text="Four.")).close()  # the refusal cost no token
        assert (await refusal(admission, text="Five.")).code == "rate_limited"
        streams.check_integrity()

    asyncio.run(scenario())


def test_each_credential_is_its_own_holder() -> None:
    """Two client tokens of one key are two holders (one count each) charged to one client."""

    async def scenario() -> None:
        admission = build()
        limited(admission)

        async def open_as(holder: str, text: str) -> StreamLease:
            principal = Principal(kind="client_token", client="key:k", holder=holder)
            return await admission.open(
                transport="webrtc",
                principal=principal,
                request=request(text),
                priority="realtime",
            )

        first = await open_as("token:1", "One.")
        second = await open_as("token:2", "Two.")
        with pytest.raises(EdgeError) as refused:
            await open_as("token:1", "Three.")
        assert refused.value.code == "too_many_streams"
        first.close()
        second.close()

    asyncio.run(scenario())


async def _done(lease: StreamLease) -> None:
    await drain(lease)


async def _cancelled(lease: StreamLease) -> None:
    lease.close()


async def _client_gone(lease: StreamLease) -> None:
    outputs = lease.outputs()
    await anext(outputs)
    await outputs.aclose()
    lease.close()


async def _failed(lease: StreamLease) -> None:
    with pytest.raises(EdgeError):
        await drain(lease)


async def _text_stream_finished(lease: StreamLease) -> None:
    lease.speak_next(request("One."))
    [output async for output in lease.outputs()]
    lease.finish("eos")


@pytest.mark.parametrize(
    ("engine", "end"),
    [
        (FakeEngine(), _done),
        (FakeEngine(), _cancelled),
        (FakeEngine(seconds=(0.1, 0.2)), _client_gone),
        (FakeEngine(error=EngineError("model blew up", "internal")), _failed),
        (FakeEngine(error=EngineUnavailable("engine lost", retry_after_s=1.0)), _failed),
        (FakeEngine(), _text_stream_finished),
    ],
    ids=["done", "cancelled", "client gone", "engine error", "engine lost", "text stream"],
)
def test_the_place_comes_back_however_the_stream_ends(
    engine: FakeEngine, end: Callable[[StreamLease], Awaitable[None]]
) -> None:
    async def scenario() -> None:
        admission = build(engine)
        server = admission.config.server.model_copy(update={"resume_timeout_s": 0.0})
        admission.config = admission.config.model_copy(update={"server": server})
        streams = limited(admission)
        lease = await open_lease(admission, text="First.")
        assert (await refusal(admission, text="Second.")).code == "too_many_streams"
        await end(lease)
        assert lease.ended and streams.count(CLIENT) == 0
        lease.close()  # a second end gives back nothing more
        (await open_lease(admission, text="Third.")).close()
        streams.check_integrity()

    asyncio.run(scenario())


def test_a_refusal_after_the_count_gives_the_place_back() -> None:
    async def scenario() -> None:
        guarded = build(guard=BrokenGuard())  # fails closed: content_refused
        streams = limited(guarded)
        assert (await refusal(guarded)).code == "content_refused"
        assert streams.count(CLIENT) == 0

        spent = build(requests_per_minute=1)
        streams = limited(spent, 2)
        (await open_lease(spent, text="One.")).close()
        assert (await refusal(spent, text="Two.")).code == "rate_limited"
        assert streams.count(CLIENT) == 0

        full = build(max_num_seqs=1, max_queue_length=0)
        streams = limited(full)
        held = await open_lease(full, client="holder")
        assert (await refusal(full)).code == "queue_full"
        assert streams.count(CLIENT) == 0
        held.close()

        huge = build(kv_pages=2)
        streams = limited(huge)
        assert (await refusal(huge)).code == "too_large"
        assert streams.count(CLIENT) == 0

    asyncio.run(scenario())


def test_a_stream_whose_client_leaves_while_queued_gives_its_place_back() -> None:
    async def scenario() -> None:
        admission = build(max_num_seqs=1)
        streams = limited(admission)
        held = await open_lease(admission, client="holder")
        waiting = asyncio.create_task(open_lease(admission))
        await until(lambda: admission.gate.queues)
        assert streams.count(CLIENT) == 1  # a queued stream counts
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        assert streams.count(CLIENT) == 0
        held.close()

    asyncio.run(scenario())


def test_a_resumed_stream_counts_once() -> None:
    async def scenario() -> None:
        admission = build()
        streams = limited(admission)
        principal = Principal(kind="stream_key", client=CLIENT, holder=CLIENT)

        async def resume(text: str) -> StreamLease:
            return await admission.resume(
                transport="websocket",
                principal=principal,
                request=request(text),
                priority="realtime",
                rows=np.zeros((0, 1), np.int32),
                frames_heard=0,
            )

        held = await open_lease(admission, text="Other.")
        with pytest.raises(EdgeError) as refused:
            await resume("Lost.")
        assert refused.value.code == "too_many_streams"
        held.close()
        first = await open_lease(admission, text="Lost.")  # its node had not noticed the loss
        resumed = await resume("Lost.")  # the same stream, counted once
        assert streams.count(CLIENT) == 1
        first.close()
        assert streams.count(CLIENT) == 1  # the old lease's end frees nothing of the new one
        resumed.close()
        assert streams.count(CLIENT) == 0

    asyncio.run(scenario())
