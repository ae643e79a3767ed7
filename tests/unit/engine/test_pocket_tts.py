"""Pocket TTS on the paged engine against ``transformers``: at temperature 0 (zero flow noise,
``do_sample=False``) speech equals ``PocketTTSForConditionalGeneration.generate`` + the
processor's decode on tiny random checkpoints in the public layout, frame for frame (the same
ending: the model's end-of-speech rule or its frame budget) and sample for sample to float32
rounding, without a voice, with a preset voice and with a voice cloned from a clip; alone and
with other streams joining and leaving. Seeded sampling draws from each stream's own
generator (the batch changes nothing but float rounding), a resumed stream goes on as it
would have, rows this model could not have made are refused, and the KV pool is intact after
every scenario."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch

from cadenza.contract.errors import RequestRejected
from cadenza.contract.request import ResumePoint, StreamOutput, SynthesisRequest
from cadenza.contract.sampling import SamplingParams
from cadenza.engine.engine import Engine
from cadenza.engine.layouts.latent_rows import NOT_ENDED, latent_bits
from cadenza.engine.offline import synthesize
from tests.support.float32_compute import float32_cpu_config
from tests.support.pocket_tts_checkpoints import (
    AUDIO_LATENT_ID,
    SEED0_ENDINGS,
    reference_frames_after_eos,
    reference_pocket_tts_run,
    reference_prompt_ids,
    voice_clip,
    write_pocket_tts_checkpoint,
)

GREEDY = SamplingParams(temperature=0.0, top_k=0)
FRAME = 1920  # samples a frame at 24 kHz
ATOL = 5e-5  # float32 rounding of two implementations (measured: under 1e-5)
EOS_TEXT = "Hello world."  # ends by the model's end-of-speech rule (SEED0_ENDINGS)
LENGTH_TEXT = "This is a test of the speech model."  # ends at its frame budget


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    return write_pocket_tts_checkpoint(tmp_path_factory.mktemp("pocket") / "pocket-tiny")


def engine_for(directory: Path, **options: object) -> Engine:
    """Float32 compute, and a length rule that never ends a stream before the model does."""
    return Engine.from_pretrained(
        str(directory),
        dtype="float32",
        cpu=float32_cpu_config(),
        limits={"chars_per_second": 0.5},
        **options,
    )


@pytest.fixture(scope="module")
def engine(checkpoint) -> Engine:
    return engine_for(checkpoint)


def request(
    request_id: str,
    text: str,
    *,
    voice: str = "default",
    clip: np.ndarray | None = None,
    sampling: SamplingParams = GREEDY,
) -> SynthesisRequest:
    return SynthesisRequest(
        request_id,
        text,
        voice,
        None,
        sampling,
        prompt_audio=None if clip is None else clip.astype("<f4").tobytes(),
        prompt_sample_rate=24000,
    )


def run_streams(
    engine: Engine, requests: list[tuple[int, SynthesisRequest]]
) -> dict[str, list[StreamOutput]]:
    """Each request added at its step; every stream's outputs."""
    pending = sorted(requests, key=lambda item: item[0])
    outputs: dict[str, list[StreamOutput]] = {r.request_id: [] for _, r in requests}
    step = 0
    while pending or engine.has_unfinished_requests():
        while pending and pending[0][0] <= step:
            engine.add_request(pending.pop(0)[1])
        for output in engine.step():
            assert output.error is None, output.error
            outputs[output.request_id].append(output)
        step += 1
    engine.check_integrity()
    return outputs


def audio_of(outputs: list[StreamOutput]) -> np.ndarray:
    return np.concatenate([o.audio for o in outputs])


def assert_equals_reference(audio: np.ndarray, reference) -> None:
    assert len(audio) == reference.frames * FRAME
    expected = np.clip(reference.waveform.numpy(), -1.0, 1.0)
    np.testing.assert_allclose(audio, expected, atol=ATOL, rtol=0)


def test_prompts_are_the_processors_token_for_token(checkpoint, engine) -> None:
    model = engine.model
    clip = voice_clip(0.4, seed=2)
    codes = engine.intake.codec.encode_audio(clip)
    frames = [list(map(int, frame)) for frame in codes.T.tolist()]
    texts = {text for text, _ in SEED0_ENDINGS}
    for text in (*sorted(texts), "  two   spaces\nand a line "):
        rows = model.build_prompt(text, "default")
        assert [row[0] for row in rows] == reference_prompt_ids(checkpoint, text)
        assert rows[-1][1] == reference_frames_after_eos(checkpoint, text)
        with_clip = model.build_prompt(text, "default", frames)
        assert [r[0] for r in with_clip] == reference_prompt_ids(checkpoint, text, clip)
        with_preset = model.build_prompt(text, "alba")
        assert [r[0] for r in with_preset] == reference_prompt_ids(checkpoint, text, voice="alba")
    assert model.voices == ("default", "alba", "marius")


@pytest.mark.parametrize("text", [EOS_TEXT, LENGTH_TEXT])
@pytest.mark.parametrize("voice", ["default", "alba", "clip"])
def test_greedy_speech_equals_transformers(checkpoint, engine, text, voice) -> None:
    clip = voice_clip(0.5, seed=1) if voice == "clip" else None
    preset = "alba" if voice == "alba" else None
    reference = reference_pocket_tts_run(checkpoint, text, clip, preset)
    audio = synthesize(
        engine,
        text,
        voice=preset or "default",
        sampling=GREEDY,
        prompt_audio=b"" if clip is None else clip.tobytes(),
    )
    assert_equals_reference(audio, reference)
    engine.check_integrity()


def test_both_endings_are_exercised(checkpoint) -> None:
    for voice in (None, "alba"):
        assert reference_pocket_tts_run(checkpoint, EOS_TEXT, voice=voice).ended_by == "eos"
        assert reference_pocket_tts_run(checkpoint, LENGTH_TEXT, voice=voice).ended_by == "length"


def test_streams_joining_and_leaving_each_equal_their_own_reference(checkpoint, engine) -> None:
    clip = voice_clip(0.3, seed=4)
    cases = [
        (0, request("a", LENGTH_TEXT)),
        (3, request("b", EOS_TEXT, voice="marius")),
        (5, request("c", "Good morning, how are you today?", clip=clip)),
        (30, request("d", "Hi.", voice="alba")),
    ]
    outputs = run_streams(engine, cases)
    references = {
        "a": reference_pocket_tts_run(checkpoint, LENGTH_TEXT),
        "b": reference_pocket_tts_run(checkpoint, EOS_TEXT, voice="marius"),
        "c": reference_pocket_tts_run(checkpoint, "Good morning, how are you today?", clip),
        "d": reference_pocket_tts_run(checkpoint, "Hi.", voice="alba"),
    }
    for name, reference in references.items():
        assert_equals_reference(audio_of(outputs[name]), reference)


def test_seeded_sampling_depends_on_the_seed_not_on_the_batch(engine) -> None:
    def sampled(seed: int, companions: int) -> np.ndarray:
        sampling = SamplingParams(temperature=0.7, top_k=0, seed=seed)
        cases = [(0, request("mine", LENGTH_TEXT, sampling=sampling))]
        cases += [(i, request(f"other{i}", EOS_TEXT)) for i in range(companions)]
        return audio_of(run_streams(engine, cases)["mine"])

    alone, batched = sampled(7, 0), sampled(7, 3)
    assert len(alone) == len(batched)  # batched products round differently, nothing more
    np.testing.assert_allclose(alone, batched, atol=ATOL, rtol=0)
    greedy = synthesize(engine, LENGTH_TEXT, sampling=GREEDY)
    assert not np.array_equal(alone[: len(greedy)], greedy[: len(alone)])
    assert not np.array_equal(alone, sampled(8, 0))


def test_a_resumed_stream_goes_on_as_it_would_have(engine) -> None:
    sampling = SamplingParams(temperature=0.7, top_k=0, seed=3)
    whole_request = request("whole", LENGTH_TEXT, sampling=sampling)
    whole = run_streams(engine, [(0, whole_request)])["whole"]
    rows = np.concatenate([o.rows for o in whole if o.rows is not None])
    heard = len(rows) // 2
    assert heard >= 4, "the stream is long enough to resume in its middle"
    point = ResumePoint(tuple(map(tuple, rows[:heard].tolist())), heard)
    resumed = dataclasses.replace(whole_request, request_id="tail", resume=point)
    tail = run_streams(engine, [(0, resumed)])["tail"]
    tail_rows = np.concatenate([o.rows for o in tail if o.rows is not None])
    assert tail_rows.shape == rows[heard:].shape  # the same frames, the same ending
    np.testing.assert_array_equal(tail_rows[:, [0, -1]], rows[heard:, [0, -1]])
    # The rows already made are prefilled at once instead of decoded one by one: the
    # products round differently, nothing more.
    np.testing.assert_allclose(
        tail_rows[:, 1:-1].astype("<i4").view("<f4"),
        rows[heard:, 1:-1].astype("<i4").view("<f4"),
        atol=ATOL,
        rtol=0,
    )
    np.testing.assert_allclose(audio_of(tail), audio_of(whole)[heard * FRAME :], atol=ATOL)


def test_rows_this_model_could_not_have_made_are_refused_on_resume(engine) -> None:
    good = latent_bits(torch.zeros(1, engine.model.spec.latent_dim))[0]
    nan = latent_bits(torch.full((1, engine.model.spec.latent_dim), float("nan")))[0]
    cases = {
        "starts with the audio latent id": [7, *good, NOT_ENDED],
        "NaN or infinite": [AUDIO_LATENT_ID, *nan, NOT_ENDED],
        "countdown 5 cannot follow -1": [AUDIO_LATENT_ID, *good, 5],
        "fit this model's rows": [AUDIO_LATENT_ID, *good],
    }
    for message, row in cases.items():
        point = ResumePoint((tuple(row),), 0)
        with pytest.raises(RequestRejected, match=message):
            engine.intake.speech(dataclasses.replace(request("r", EOS_TEXT), resume=point))


def test_what_pocket_tts_cannot_take_is_refused_by_name(engine) -> None:
    with pytest.raises(RequestRejected, match="unknown voice 'nobody'"):
        engine.intake.speech(request("v", EOS_TEXT, voice="nobody"))
    with pytest.raises(RequestRejected, match="needs some text"):
        engine.intake.speech(request("t", "   "))
    guided = SamplingParams(temperature=0.0, top_k=0, guidance_scale=3.0)
    with pytest.raises(RequestRejected, match="guidance_scale"):
        engine.intake.speech(request("g", EOS_TEXT, sampling=guided))
    with pytest.raises(RequestRejected, match="speech prompt"):
        engine.intake.speech(
            dataclasses.replace(request("p", EOS_TEXT), prompt_audio=b"\x00\x00\x80\x7f" * 3)
        )
    engine.check_integrity()
