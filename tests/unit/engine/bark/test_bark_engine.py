"""The Bark serving engine on a tiny random checkpoint: what it announces (voices, one page a
stream, Bark's defaults), streams equal to the batch run offline, seeded sampling reproducible
whatever else runs, cancels and endings that free every slot, garbage requests refused with
the reason, the per-frame calibration with its stage split and first audio, live steps and
idle probes weighed by what their own work cost."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from cadenza.config import CadenzaConfig
from cadenza.contract.calibration import Calibration
from cadenza.contract.errors import RequestRejected
from cadenza.contract.request import (
    ContextTurn,
    FinishReason,
    ResumePoint,
    StreamOutput,
    SynthesisRequest,
)
from cadenza.contract.sampling import SamplingParams
from cadenza.engine.models.bark.bark_calibration import calibrate_bark
from cadenza.engine.models.bark.bark_engine import DEFAULT_SAMPLING, BarkEngine
from cadenza.engine.models.bark.bark_offline import synthesize_bark
from cadenza.engine.models.bark.bark_request import BarkSampling
from cadenza.engine.models.bark.bark_step_cost import BarkStepCost
from cadenza.engine.realtime.probe import probe_engine
from tests.unit.engine.bark.bark_checkpoints import SHORT_VOICE, VOICE, build_tiny_bark

TEXT = "hello world the quick brown fox"
GREEDY = SamplingParams(temperature=0.0, top_k=0)


@pytest.fixture(scope="module")
def bark_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("bark")
    build_tiny_bark(directory)
    return directory


def _engine(directory: Path, **calibration: object) -> BarkEngine:
    config = CadenzaConfig.model_validate(
        {
            "model": {"name": str(directory)},
            "engine": {"max_num_seqs": 4, "max_num_batched_tokens": 128},
            "calibration": {"mode": "off", **calibration},
        }
    )
    return BarkEngine.from_config(config, directory)


@pytest.fixture(scope="module")
def engine(bark_dir: Path) -> BarkEngine:
    return _engine(bark_dir)


def _run(engine: BarkEngine, *requests: SynthesisRequest) -> dict[str, list[StreamOutput]]:
    outputs: dict[str, list[StreamOutput]] = {r.request_id: [] for r in requests}
    for request in requests:
        engine.add_request(request)
    while engine.has_unfinished_requests():
        for output in engine.step():
            outputs[output.request_id].append(output)
    engine.check_integrity()
    return outputs


def _audio(outputs: list[StreamOutput]) -> np.ndarray:
    return np.concatenate([o.audio for o in outputs])


def test_it_announces_voices_one_page_a_stream_and_barks_defaults(engine: BarkEngine) -> None:
    info = engine.info
    assert info.voices == ("default", SHORT_VOICE, VOICE)
    assert info.sample_rate == 24000 and info.frame_rate == 75.0
    assert info.kv_pages_total == info.max_num_seqs == 4
    assert info.shape.pages(10_000, 100_000) == 1
    assert info.default_sampling == DEFAULT_SAMPLING and info.calibration is None


def test_streams_equal_the_offline_path_and_end_once(engine: BarkEngine, bark_dir: Path) -> None:
    requests = [
        SynthesisRequest("a", TEXT, VOICE, max_duration_s=1.0, sampling=GREEDY),
        SynthesisRequest("b", "the lazy dog", SHORT_VOICE, max_duration_s=0.6, sampling=GREEDY),
    ]
    outputs = _run(engine, *requests)
    for request in requests:
        ends = [o.finish_reason for o in outputs[request.request_id] if o.finished]
        assert ends in ([FinishReason.EOS], [FinishReason.LENGTH])
        offline = synthesize_bark(
            bark_dir, request.text, request.voice, BarkSampling(), request.max_duration_s
        )
        np.testing.assert_allclose(_audio(outputs[request.request_id]), offline.audio, atol=1e-5)


def test_seeded_sampling_is_reproducible_whatever_else_runs(engine: BarkEngine) -> None:
    sampled = SamplingParams(temperature=0.8, top_k=0, seed=11)
    alone = _run(engine, SynthesisRequest("s", TEXT, VOICE, 0.8, sampled))["s"]
    other = SynthesisRequest("o", "the fox", SHORT_VOICE, 0.5, sampled.with_overrides(seed=2))
    together = _run(engine, SynthesisRequest("s", TEXT, VOICE, 0.8, sampled), other)["s"]
    np.testing.assert_array_equal(_audio(alone), _audio(together))


def test_a_cancel_ends_the_stream_and_frees_its_slots(engine: BarkEngine) -> None:
    engine.add_request(SynthesisRequest("c", TEXT, VOICE, 1.0, GREEDY))
    engine.step()
    assert engine.abort_request("c") and not engine.abort_request("c")
    (output,) = engine.step()
    assert output.finish_reason is FinishReason.CANCELLED
    assert not engine.has_unfinished_requests()
    engine.check_integrity()
    assert engine.stats().kv_pages_free == 4


def _garbage(text: str = TEXT, voice: str = VOICE, **fields: object) -> SynthesisRequest:
    return SynthesisRequest("g", text, voice, **{"sampling": GREEDY, **fields})  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("request_", "reason"),
    [
        (_garbage(voice="tara"), "unknown voice"),
        (_garbage(sampling=DEFAULT_SAMPLING.with_overrides(top_p=0.5)), "temperature only"),
        (_garbage(sampling=SamplingParams()), "top_k"),
        (_garbage(prompt_audio=b"\0" * 400), "speech prompt"),
        (_garbage(context=(ContextTurn("0", "hi"),)), "context"),
        (_garbage(resume=ResumePoint(((1, 2),), 0)), "not from rows"),
        (_garbage(max_duration_s=float("nan")), "max_duration_s"),
        (_garbage(text="   "), "empty"),
        (_garbage(text="word " * 300), "256"),
    ],
)
def test_garbage_requests_are_refused_with_the_reason(
    engine: BarkEngine, request_: SynthesisRequest, reason: str
) -> None:
    with pytest.raises(RequestRejected, match=reason):
        engine.add_request(request_)
    assert not engine.has_unfinished_requests()
    engine.check_integrity()


@pytest.mark.parametrize(
    ("temperature", "fine", "stages"),
    [
        (0.0, None, (None, None)),
        (0.7, None, (0.7, 0.5)),
        (0.7, 0.0, (0.7, None)),
        (0.0, 0.9, (None, 0.9)),
    ],
)
def test_each_stage_gets_its_temperature(
    engine: BarkEngine, temperature: float, fine: float | None, stages: tuple
) -> None:
    sampling = DEFAULT_SAMPLING.with_overrides(temperature=temperature, seed=5)
    request = SynthesisRequest("t", TEXT, VOICE, 1.0, sampling)
    if fine is not None:
        request = SynthesisRequest("t", TEXT, VOICE, 1.0, replace(sampling, fine_temperature=fine))
    bark, cap = engine.bark_request(request)
    assert (bark.sampling.semantic_temperature, bark.sampling.fine_temperature) == stages
    assert bark.sampling.coarse_temperature == bark.sampling.semantic_temperature
    assert bark.sampling.seed == 5 and cap == 50  # ceil(1.0 s * 49.9 semantic tokens a second)


def test_a_resumed_stream_goes_on_where_its_listener_left_it(bark_dir: Path) -> None:
    sampled = DEFAULT_SAMPLING  # no seed: drawn from the request's id
    whole = _run(_engine(bark_dir), SynthesisRequest("r", TEXT, VOICE, 1.0, sampled))["r"]
    audio, codes = _audio(whole), np.concatenate([o.codes for o in whole if o.codes is not None])
    assert len(audio) == 320 * len(codes) and codes.shape[1] == 8
    heard = len(codes) // 2
    moved = SynthesisRequest("r", TEXT, VOICE, 1.0, sampled, resume=ResumePoint((), heard))
    rest = _run(_engine(bark_dir), moved)["r"]
    np.testing.assert_array_equal(_audio(rest), audio[320 * heard :])
    np.testing.assert_array_equal(
        np.concatenate([o.codes for o in rest if o.codes is not None]), codes[heard:]
    )
    other = _run(_engine(bark_dir), SynthesisRequest("o", TEXT, VOICE, 1.0, sampled))["o"]
    assert not np.array_equal(_audio(other), audio)  # another request, another seed


def test_a_stream_ahead_of_its_listener_rests_until_its_next_audio_is_due(
    engine: BarkEngine, bark_dir: Path
) -> None:
    now = [0.0]
    resting = BarkEngine(
        engine.bark, config=engine.config, model_name="bark", device="cpu", clock=lambda: now[0]
    )
    long = "hello world the quick brown fox jumps over lazy dog"
    resting.add_request(SynthesisRequest("a", long, VOICE, 16.0, GREEDY))
    heard: list[StreamOutput] = []
    while not heard:
        heard += [o for o in resting.step() if o.audio.size]
    first_s = heard[0].audio.size / 24000  # a whole fine window, and its listener has not moved
    assert first_s > 5 and resting.idle_s() > 0
    work = resting.last_step
    assert resting.step() == [] and resting.last_step is work  # it rested: nothing ran
    now[0] += first_s  # the listener has heard it all: the next audio is due
    assert resting.idle_s() == 0
    while resting.has_unfinished_requests():
        heard += resting.step()
        now[0] += 1.0  # the listener keeps up with anything the engine makes
    offline = synthesize_bark(bark_dir, long, VOICE, BarkSampling(), 16.0)
    np.testing.assert_allclose(_audio(heard), offline.audio, atol=1e-5)
    resting.check_integrity()


def test_a_duplicate_id_is_refused(engine: BarkEngine) -> None:
    engine.add_request(SynthesisRequest("d", TEXT, VOICE, 0.3, GREEDY))
    with pytest.raises(RequestRejected, match="duplicate"):
        engine.add_request(SynthesisRequest("d", TEXT, VOICE, 0.3, GREEDY))
    engine.abort_request("d")
    engine.step()
    engine.check_integrity()


@pytest.fixture(scope="module")
def calibrated(bark_dir: Path) -> tuple[BarkEngine, Calibration, BarkStepCost]:
    engine = _engine(bark_dir, batch_sizes=(1, 2), duration_ms=400.0)
    assert engine.take_report().steps == ()  # uncalibrated: nothing to weigh live steps by
    calibration, cost = calibrate_bark(engine)
    return engine, calibration, cost


def test_the_calibration_times_a_frame_of_every_stream_by_stage(calibrated) -> None:
    engine, calibration, cost = calibrated
    assert calibration.samples[0].tokens == 1
    assert {t.stage for t in calibration.stages} == {"semantic", "coarse", "fine", "codec"}
    for sample in calibration.samples:
        shares = [t.ms_per_frame for t in calibration.stages if t.streams == sample.tokens]
        assert 0 < sum(shares) <= sample.ms
    assert 0 < calibration.first_audio_s < calibration.measured_s
    assert any(coefficient > 0 for coefficient in cost.coefficients)
    engine.apply_calibration(calibration, cost)
    assert engine.info.realtime.ttfa_target_s >= calibration.first_audio_s
    assert engine.take_report().steps == ()  # the calibration's steps are not live evidence
    _run(engine, SynthesisRequest("live", TEXT, VOICE, 0.4, GREEDY))
    steps = engine.take_report().steps
    assert steps and all(step.decodes == step.tokens == 1 for step in steps)
    engine.check_integrity()


def test_a_probe_steps_synthetic_streams_and_leaves_the_engine_idle(calibrated) -> None:
    engine, calibration, cost = calibrated
    engine.apply_calibration(calibration, cost)
    result = engine.probe(2, 300.0, lambda: False)
    assert result.outcome == "done" and result.batch == 2
    assert result.report.steps and all(step.decodes <= 2 for step in result.report.steps)
    assert not engine.has_unfinished_requests() and engine.take_report().steps == ()
    engine.check_integrity()
    assert probe_engine(engine, 1, 300.0, lambda: True).outcome == "interrupted"  # handed over
    engine.check_integrity()
    engine.add_request(SynthesisRequest("busy", TEXT, VOICE, 0.3, GREEDY))
    assert engine.probe(1, 300.0, lambda: False).outcome == "busy"
    engine.abort_request("busy")
    engine.step()
    engine.check_integrity()


def test_an_uncalibrated_engine_does_not_probe(engine: BarkEngine) -> None:
    assert engine.probe(1, 100.0, lambda: False).outcome == "unsupported"
