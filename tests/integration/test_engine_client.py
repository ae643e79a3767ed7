"""EngineClient with the engine in a thread (``mode = "inprocess"``): routing, abort, refusals."""

from __future__ import annotations

import asyncio

import msgpack
import pytest
import zmq

from cadenza.config import load_config
from cadenza.contract.request import FinishReason, SynthesisRequest
from cadenza.contract.sampling import SamplingParams
from cadenza.ipc.edge_side.engine_client import EngineClient, EngineError

HOP = 320


def _run(scenario, **client_options):
    async def main():
        config = load_config(
            overrides={"supervision": {"mode": "inprocess"}, "model": {"device": "cpu"}}
        )
        client = EngineClient(config, **client_options)
        await client.start()
        try:
            return await scenario(client)
        finally:
            await client.close()

    return asyncio.run(main())


async def _collect(client, request):
    return [output async for output in client.generate(request)]


def test_streams_run_concurrently_and_each_gets_its_own_audio():
    async def scenario(client):
        assert client.is_ready()
        assert client.info.model_name == "cadenza-tiny" and client.info.sample_rate == 24000
        requests = [
            SynthesisRequest(f"r{i}", "x" * (14 * (i + 1)), sampling=SamplingParams(seed=i))
            for i in range(3)
        ]
        results = await asyncio.gather(*(_collect(client, r) for r in requests))
        assert client.num_streams == 0
        return results

    results = _run(scenario)
    for i, outputs in enumerate(results):
        assert outputs[-1].finish_reason is FinishReason.LENGTH
        assert sum(len(o.audio) for o in outputs) == 75 * (i + 1) * HOP


def test_leaving_the_loop_aborts_the_request_in_the_engine():
    async def scenario(client):
        stream = client.generate(SynthesisRequest("long", "x" * 3000))
        first = await anext(stream)
        assert len(first.audio) > 0
        await stream.aclose()
        # the engine frees it; a new stream then starts right away
        outputs = await asyncio.wait_for(_collect(client, SynthesisRequest("next", "hi")), 30)
        return outputs

    outputs = _run(scenario)
    assert outputs[-1].finished


def test_refused_request_raises_rejected():
    async def scenario(client):
        with pytest.raises(EngineError) as caught:
            await _collect(client, SynthesisRequest("v", "hello", voice="nobody"))
        assert caught.value.code == "rejected"
        # duplicate ids are refused before they reach the engine
        stream = client.generate(SynthesisRequest("same", "x" * 500))
        await anext(stream)
        with pytest.raises(EngineError, match="duplicate"):
            await _collect(client, SynthesisRequest("same", "hello"))
        await stream.aclose()
        return True

    assert _run(scenario)


def test_closed_client_refuses_new_streams():
    async def main():
        config = load_config(
            overrides={"supervision": {"mode": "inprocess"}, "model": {"device": "cpu"}}
        )
        client = EngineClient(config)
        await client.start()
        await client.close()
        assert not client.is_ready()
        with pytest.raises(EngineError) as caught:
            await _collect(client, SynthesisRequest("late", "hi"))
        assert caught.value.code == "unavailable"

    asyncio.run(main())


def test_engine_that_cannot_load_fails_start():
    async def main():
        config = load_config(
            overrides={
                "supervision": {"mode": "inprocess"},
                "model": {"name": "no-such-model", "device": "cpu"},
            }
        )
        client = EngineClient(config)
        with pytest.raises(EngineError, match="no-such-model"):
            await client.start()

    asyncio.run(main())


def test_an_invalid_output_fails_its_stream_and_the_engine_serves_on():
    async def scenario(client):
        stream = client.generate(SynthesisRequest("torn", "x" * 3000))
        await anext(stream)
        forger = client._sync_context.socket(zmq.PUSH)
        forger.connect(client._from_engine.getsockopt(zmq.LAST_ENDPOINT).decode())
        forger.send(msgpack.packb({"type": "output", "request_id": "torn", "audio": 5}))
        forger.close(linger=1000)
        with pytest.raises(EngineError) as failed:
            async for _ in stream:
                pass
        assert failed.value.code == "internal"
        assert client.num_streams == 0 and client.is_ready()
        after = await _collect(client, SynthesisRequest("next", "hello"))
        assert after[-1].finish_reason is FinishReason.LENGTH

    _run(scenario)


def test_a_failing_stats_callback_does_not_stop_the_reader():
    def broken(stats):
        raise RuntimeError("metrics bug")

    async def scenario(client):
        await asyncio.sleep(1.2)  # two stats messages or more
        outputs = await _collect(client, SynthesisRequest("r", "hello"))
        assert outputs[-1].finish_reason is FinishReason.LENGTH
        assert client.is_ready()

    _run(scenario, on_stats=broken)


def test_a_probe_runs_on_the_idle_engine_and_its_steps_come_back_apart():
    """The wire of a probe: the edge asks, the idle engine runs synthetic streams, the steps
    come back in ``probed`` (not in ``stats``), and the engine is idle afterwards."""

    async def scenario(client):
        probed = asyncio.get_running_loop().create_future()
        stats = []
        client.on_probe = lambda message: probed.done() or probed.set_result(message)
        client.on_stats = stats.append
        client.probe(3, 2_000.0)
        message = await asyncio.wait_for(probed, 30)
        await asyncio.sleep(0.6)  # a report after the probe
        return message, stats

    message, stats = _run(scenario)
    assert message.outcome == "done" and message.batch == 3
    assert any(step.decodes == 3 for step in message.report.steps)
    after = stats[-1]
    assert after.stats.num_running == 0 and after.stats.num_waiting == 0
    assert not any(step.decodes == 3 for s in stats for step in s.report.steps)


def test_a_streams_next_part_goes_to_a_busy_engine_a_new_stream_does_not():
    """An engine silent for longer than the readiness window (a long step: Bark's on a CPU)
    takes no new stream, but a text stream's next segment on it goes on."""

    async def scenario(client):
        client._last_heartbeat -= 60.0  # as if its last step took a minute
        assert not client.is_ready()
        with pytest.raises(EngineError, match="not ready"):
            await _collect(client, SynthesisRequest("new", "hello"))
        outputs = await _collect_continuing(client, SynthesisRequest("next", "hello"))
        return outputs[-1].finish_reason

    assert _run(scenario) is FinishReason.LENGTH


async def _collect_continuing(client, request):
    return [output async for output in client.generate(request, continuing=True)]
