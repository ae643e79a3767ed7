"""Overlapped steps (``engine.overlap_steps``, CUDA's default), driven on the CPU: each step's
result is collected one ``Engine.step`` call after its launch, while the audio of the step
before is decoded. The streams come out as without overlap (rows exactly, audio to float32
rounding); an ending stops a stream before its next step; a stream aborted with its step in
flight ends once, its pages freed and its result ignored; a resumed stream goes on as it
would have; the KV pool checks out after every step."""

from __future__ import annotations

import time

import numpy as np
import pytest

from cadenza.config import EngineConfig
from cadenza.contract.request import FinishReason, ResumePoint, SynthesisRequest
from cadenza.contract.sampling import SamplingParams
from cadenza.engine.engine import Engine
from cadenza.engine.scheduler import SequenceStatus
from tests.support.float32_compute import float32_cpu_config

TEXTS = ["a short one", "a somewhat longer stream of speech", "the third voice in the batch"]


def _engine(overlap: bool) -> Engine:
    return Engine.from_pretrained(
        "cadenza-tiny",
        cpu=float32_cpu_config(),
        device="cpu",
        seed=0,
        kv_cache_memory_bytes=64 << 20,
        engine_config=EngineConfig(overlap_steps=overlap),
    )


@pytest.fixture(scope="module")
def overlapped() -> Engine:
    engine = _engine(True)
    assert engine.overlaps_steps
    return engine


def _drain(engine: Engine, stop: dict[str, int] | None = None) -> dict[str, list]:
    """Step ``engine`` until it is idle, the pool checked after every step; ``stop``: abort a
    stream after that many of its audio outputs (its ending then follows)."""
    outputs: dict[str, list] = {}
    while engine.has_unfinished_requests():
        for output in engine.step():
            outputs.setdefault(output.request_id, []).append(output)
            audio = [o for o in outputs[output.request_id] if not o.finished]
            if stop and len(audio) == stop.get(output.request_id) and not output.finished:
                engine.abort_request(output.request_id)
        engine.check_integrity()
    assert engine.kv.pool.num_free_pages == engine.kv.pool.num_pages  # cached ones included
    return outputs


def _rows(outputs: list) -> np.ndarray:
    return np.concatenate([o.rows for o in outputs if o.rows is not None])


def _audio(outputs: list) -> np.ndarray:
    return np.concatenate([o.audio for o in outputs])


@pytest.mark.parametrize("sampling", [SamplingParams(temperature=0.0), SamplingParams(seed=5)])
def test_the_streams_come_out_as_without_overlap(overlapped, sampling) -> None:
    results = []
    for engine in (_engine(False), overlapped):
        for i, text in enumerate(TEXTS):
            engine.add_request(SynthesisRequest(f"r{i}", text, sampling=sampling))
        results.append(_drain(engine))
    plain, overlap = results
    for i in range(len(TEXTS)):
        first, second = plain[f"r{i}"], overlap[f"r{i}"]
        assert second[-1].finished and second[-1].finish_reason == first[-1].finish_reason
        np.testing.assert_array_equal(_rows(second), _rows(first))
        np.testing.assert_allclose(_audio(second), _audio(first), atol=1e-5)


def test_a_step_launches_only_streams_still_running(overlapped, monkeypatch) -> None:
    launch = overlapped.runner.launch
    launched = []

    def checked(batch):
        for seq, _ in batch.items():
            assert seq.status is SequenceStatus.RUNNING, seq.request_id
        launched.append(batch)
        return launch(batch)

    monkeypatch.setattr(overlapped.runner, "launch", checked)
    for i, text in enumerate(TEXTS):
        overlapped.add_request(SynthesisRequest(f"e{i}", text, max_duration_s=0.4))
    outputs = _drain(overlapped)
    assert all(outputs[f"e{i}"][-1].finished for i in range(len(TEXTS)))
    assert len(launched) > 5


def test_a_stream_aborted_with_its_step_in_flight_ends_once(overlapped) -> None:
    overlapped.add_request(SynthesisRequest("stay", TEXTS[1]))
    overlapped.add_request(SynthesisRequest("gone", TEXTS[2]))
    while overlapped.sequence("gone") is None or overlapped.sequence("gone").num_generated < 3:
        overlapped.step()
    assert overlapped._launched is not None  # the next step is in flight
    in_flight = {seq.request_id for seq, _ in overlapped._launched.batch.items()}
    assert "gone" in in_flight
    assert overlapped.abort_request("gone")
    overlapped.check_integrity()
    outputs = _drain(overlapped)
    endings = [o for o in outputs["gone"] if o.finished]
    assert len(endings) == 1 and endings[0].finish_reason is FinishReason.CANCELLED
    assert outputs["stay"][-1].finish_reason is FinishReason.LENGTH


def test_while_a_step_is_in_flight_the_engine_does_not_rest(overlapped) -> None:
    overlapped.add_request(SynthesisRequest("busy", TEXTS[0]))
    overlapped.step()
    assert overlapped._launched is not None and overlapped.idle_s() == 0.0
    _drain(overlapped)
    assert overlapped._launched is None and not overlapped.has_unfinished_requests()


def test_a_resumed_stream_goes_on_as_it_would_have(overlapped) -> None:
    sampling = SamplingParams(seed=9)
    text = TEXTS[1]
    overlapped.add_request(SynthesisRequest("whole", text, sampling=sampling))
    whole = _drain(overlapped)["whole"]
    overlapped.add_request(SynthesisRequest("head", text, sampling=sampling))
    head = [o for o in _drain(overlapped, stop={"head": 2})["head"] if not o.finished]
    codes = np.concatenate([o.codes for o in head if o.codes is not None])
    point = ResumePoint(tuple(map(tuple, _rows(head).tolist())), len(codes))
    overlapped.add_request(SynthesisRequest("head", text, sampling=sampling, resume=point))
    tail = _drain(overlapped)["head"]
    assert tail[-1].finished and not tail[-1].error
    np.testing.assert_array_equal(np.concatenate([_rows(head), _rows(tail)]), _rows(whole))


def test_a_stream_far_ahead_lets_the_engine_rest_with_nothing_in_flight(
    overlapped, monkeypatch
) -> None:
    """Overlapped, the engine still rests when every stream is far ahead of its listener:
    it launches no step it would then leave waiting."""
    policy = overlapped.policy
    monkeypatch.setattr(policy, "max_lead_s", 0.3)
    now = [time.monotonic()]

    def slow_clock() -> float:  # slower than the engine however busy the machine is
        now[0] += 1e-4
        return now[0]

    monkeypatch.setattr(policy, "clock", slow_clock)
    monkeypatch.setattr(overlapped.audio, "clock", slow_clock)
    overlapped.add_request(SynthesisRequest("ahead", "x" * 70, max_duration_s=5.0))
    for _ in range(200):
        overlapped.step()
        if overlapped.idle_s() > 0:
            break
    assert overlapped._launched is None and 0 < overlapped.idle_s() <= 5.0
    overlapped.add_request(SynthesisRequest("new", "hello"))
    assert overlapped.idle_s() == 0.0
    assert overlapped.abort_request("ahead") and overlapped.abort_request("new")
    _drain(overlapped)
