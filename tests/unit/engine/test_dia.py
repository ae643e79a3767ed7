"""Dia on the paged engine against ``transformers``: greedy speech with classifier-free guidance
equals ``DiaForConditionalGeneration.generate`` + the DAC decode on tiny random checkpoints in
the public layout, alone and with other streams joining and leaving; so does a cloned voice
(an audio prompt: a context turn's clip and transcript, or a speech prompt whose transcript
begins the text), the new speech only; what Dia cannot take is refused by name; the KV pool is
intact after every scenario."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from cadenza.contract.errors import RequestRejected
from cadenza.contract.request import ContextTurn, ResumePoint, SynthesisRequest
from cadenza.contract.sampling import SamplingParams
from cadenza.engine.engine import Engine
from cadenza.engine.models.dia import dia_encoder_text, dia_text_ids
from cadenza.engine.offline import synthesize
from tests.support.dia_checkpoints import (
    HOP_LENGTH,
    SAMPLING_RATE,
    frames_for,
    reference_dia_generate,
    reference_text_ids,
    tiny_dia_checkpoint,
)
from tests.support.float32_compute import float32_cpu_config
from tests.support.step_audit import checkpoint_step_reads

TEXTS = ("[S1] Hello there. [S2] Hi!", "[S1] A longer line, with commas; and more.", "[S2] Oh.")
GREEDY = SamplingParams(temperature=0.0, top_k=50)
DELAY_TAIL = 16  # transformers' max_new_tokens = frames + max(delay) + 1


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    return tiny_dia_checkpoint(tmp_path_factory.mktemp("dia") / "dia-tiny", legacy_names=True)


@pytest.fixture(scope="module")
def ending_checkpoint(tmp_path_factory) -> Path:
    """A checkpoint whose streams end by themselves (end of speech is often its best id)."""
    root = tmp_path_factory.mktemp("dia-ending")
    return tiny_dia_checkpoint(root / "dia-tiny", seed=3, eos_scale=2.0)


def engine_for(directory: Path, **options: object) -> Engine:
    return Engine.from_pretrained(
        str(directory), dtype="float32", cpu=float32_cpu_config(), **options
    )


@pytest.fixture(scope="module")
def engine(checkpoint) -> Engine:
    return engine_for(checkpoint)


def seconds(engine: Engine, frames: int) -> float:
    return (frames + 0.5) / engine.frame_rate


def run_streams(
    engine: Engine, requests: list[tuple[int, SynthesisRequest]]
) -> dict[str, np.ndarray]:
    """Each request added at its step; every stream's whole audio."""
    pending = sorted(requests, key=lambda item: item[0])
    audio: dict[str, list[np.ndarray]] = {request.request_id: [] for _, request in requests}
    step = 0
    while pending or engine.has_unfinished_requests():
        while pending and pending[0][0] <= step:
            engine.add_request(pending.pop(0)[1])
        for output in engine.step():
            assert output.error is None, output.error
            audio[output.request_id].append(output.audio)
        step += 1
    engine.check_integrity()
    return {key: np.concatenate(pieces) for key, pieces in audio.items()}


def test_text_ids_are_the_tokenizers() -> None:
    ids, _ = reference_text_ids([TEXTS[1]])
    assert dia_text_ids(TEXTS[1]) == ids[0].tolist()
    assert dia_text_ids("[S1]é[S2]") == [1, 0xC3, 0xA9, 2]


def test_greedy_guided_speech_equals_transformers_and_the_codec(checkpoint, engine) -> None:
    frames = 24
    [(codes, audio)] = reference_dia_generate(
        checkpoint, [TEXTS[0]], guidance_scale=3.0, max_new_tokens=frames + DELAY_TAIL
    )
    assert codes.shape == (9, frames)
    sampling = GREEDY.with_overrides(guidance_scale=3.0)
    ours = synthesize(engine, TEXTS[0], max_duration_s=seconds(engine, frames), sampling=sampling)
    assert ours.shape == audio.shape
    np.testing.assert_allclose(ours, audio, atol=2e-5)
    engine.check_integrity()


def test_the_published_guidance_scale_is_the_default(checkpoint, engine) -> None:
    frames = 12
    [(_, audio)] = reference_dia_generate(
        checkpoint, [TEXTS[2]], guidance_scale=3.0, max_new_tokens=frames + DELAY_TAIL
    )
    ours = synthesize(engine, TEXTS[2], max_duration_s=seconds(engine, frames), sampling=GREEDY)
    np.testing.assert_allclose(ours, audio, atol=2e-5)


def test_unguided_speech_equals_transformers_at_scale_one(checkpoint, engine) -> None:
    frames = 16
    [(_, audio)] = reference_dia_generate(
        checkpoint, [TEXTS[1]], guidance_scale=1.0, max_new_tokens=frames + DELAY_TAIL
    )
    sampling = GREEDY.with_overrides(guidance_scale=1.0)
    ours = synthesize(engine, TEXTS[1], max_duration_s=seconds(engine, frames), sampling=sampling)
    np.testing.assert_allclose(ours, audio, atol=2e-5)


def test_streams_joining_and_leaving_each_equal_their_own_reference(checkpoint, engine) -> None:
    frames = (20, 28, 10)
    expected = [
        reference_dia_generate(
            checkpoint, [text], guidance_scale=3.0, max_new_tokens=count + DELAY_TAIL
        )[0][1]
        for text, count in zip(TEXTS, frames, strict=True)
    ]
    requests = [
        (start, SynthesisRequest(f"s{i}", text, "default", seconds(engine, count), GREEDY))
        for i, (start, text, count) in enumerate(zip((0, 3, 9), TEXTS, frames, strict=True))
    ]
    audio = run_streams(engine, requests)
    for i, reference in enumerate(expected):
        np.testing.assert_allclose(audio[f"s{i}"], reference, atol=2e-5)


def test_a_stream_that_ends_itself_ends_where_transformers_does(ending_checkpoint) -> None:
    engine = engine_for(ending_checkpoint)
    limit = 60
    [(codes, audio)] = reference_dia_generate(
        ending_checkpoint, [TEXTS[0]], guidance_scale=3.0, max_new_tokens=limit + DELAY_TAIL
    )
    assert 0 < codes.shape[1] < limit, "the checkpoint should end before the limit"
    ours = synthesize(engine, TEXTS[0], max_duration_s=seconds(engine, limit), sampling=GREEDY)
    np.testing.assert_allclose(ours, audio, atol=2e-5)
    engine.check_integrity()


@pytest.mark.parametrize(
    ("text", "sampling", "message"),
    [
        ("hi", SamplingParams(fine_temperature=0.5), "fine_temperature: dia does not take"),
        ("hi", SamplingParams(guidance_scale=0.5), "guidance_scale: .* above 1"),
        ("", GREEDY, "needs some text"),
        ("x" * 1025, GREEDY, "reads at most 1024"),
    ],
)
def test_what_dia_cannot_take_is_refused_with_the_reason(engine, text, sampling, message) -> None:
    with pytest.raises(RequestRejected, match=message):
        engine.add_request(SynthesisRequest("bad", text, "default", 0.5, sampling))
    engine.check_integrity()


TRANSCRIPT = "[S1] This is how I sound."
GUIDED = GREEDY.with_overrides(guidance_scale=3.0)


def clip(num_frames: int, seed: int = 0) -> np.ndarray:
    """A clip of noise that the codec encodes into ``num_frames`` frames (its last one part
    of a hop, zero-padded, as the processor pads it)."""
    samples = num_frames * HOP_LENGTH - 100
    assert frames_for(samples) == num_frames
    return (np.random.default_rng(seed).standard_normal(samples) * 0.1).astype(np.float32)


def cloning(request_id: str, text: str, voice: np.ndarray, frames: int, engine: Engine):
    """A request to speak ``text`` in the voice of ``voice`` (transcribed as TRANSCRIPT)."""
    turn = ContextTurn("default", TRANSCRIPT, audio=voice.tobytes())
    return SynthesisRequest(
        request_id,
        text,
        "default",
        seconds(engine, frames),
        GUIDED,
        prompt_sample_rate=SAMPLING_RATE,
        context=(turn,),
    )


def cloned_reference(checkpoint: Path, text: str, voice: np.ndarray, frames: int) -> np.ndarray:
    """transformers' new speech for ``text`` after ``voice`` and its transcript."""
    full_text = dia_encoder_text(text, [TRANSCRIPT])
    assert full_text == f"{TRANSCRIPT} {text}"
    [(codes, audio)] = reference_dia_generate(
        checkpoint,
        [full_text],
        guidance_scale=3.0,
        max_new_tokens=frames + DELAY_TAIL,
        audio_prompt=[voice],
    )
    assert codes.shape == (9, frames)
    return audio


# 6 frames: shorter than the largest delay, so the first steps emit BOS before the clip's
# last frames in the late codebooks; 17: every codebook's lead-in is the clip's.
@pytest.mark.parametrize("clip_frames", [6, 17])
def test_a_cloned_voice_equals_transformers_audio_prompt(checkpoint, engine, clip_frames) -> None:
    frames = 20
    voice = clip(clip_frames)
    expected = cloned_reference(checkpoint, TEXTS[0], voice, frames)
    ours = run_streams(engine, [(0, cloning("clone", TEXTS[0], voice, frames, engine))])
    assert ours["clone"].shape == (frames * HOP_LENGTH,)  # the new speech only
    np.testing.assert_allclose(ours["clone"], expected, atol=2e-5)


def test_a_speech_prompt_is_an_audio_prompt_whose_transcript_begins_the_text(
    checkpoint, engine
) -> None:
    frames, voice = 16, clip(9, seed=1)
    text = f"{TRANSCRIPT} {TEXTS[2]}"
    [(_, expected)] = reference_dia_generate(
        checkpoint,
        [text],
        guidance_scale=3.0,
        max_new_tokens=frames + DELAY_TAIL,
        audio_prompt=[voice],
    )
    request = SynthesisRequest(
        "prompted",
        text,
        "default",
        seconds(engine, frames),
        GUIDED,
        prompt_audio=voice.tobytes(),
        prompt_sample_rate=SAMPLING_RATE,
    )
    np.testing.assert_allclose(run_streams(engine, [(0, request)])["prompted"], expected, atol=2e-5)


def test_cloned_voices_batched_with_a_plain_stream_joining(checkpoint, engine) -> None:
    voices = (clip(17, seed=2), clip(8, seed=3))
    frames = (24, 12, 18)
    expected = {
        "clone-a": cloned_reference(checkpoint, TEXTS[1], voices[0], frames[0]),
        "plain": reference_dia_generate(
            checkpoint, [TEXTS[2]], guidance_scale=3.0, max_new_tokens=frames[1] + DELAY_TAIL
        )[0][1],
        "clone-b": cloned_reference(checkpoint, TEXTS[0], voices[1], frames[2]),
    }
    requests = [
        (0, cloning("clone-a", TEXTS[1], voices[0], frames[0], engine)),
        (3, SynthesisRequest("plain", TEXTS[2], "default", seconds(engine, frames[1]), GUIDED)),
        (5, cloning("clone-b", TEXTS[0], voices[1], frames[2], engine)),
    ]
    audio = run_streams(engine, requests)
    for name, reference in expected.items():
        np.testing.assert_allclose(audio[name], reference, atol=2e-5)


def test_a_turn_given_as_codes_clones_as_its_audio_does(engine) -> None:
    """What a conversation sends for the model's own answers (and a text stream for its
    earlier segments): the codec frames, not audio."""
    voice = clip(10, seed=6)
    frames = engine.intake.codec.encode_audio(voice).T.tolist()
    by_audio = cloning("audio", TEXTS[1], voice, 12, engine)
    turn = ContextTurn("default", TRANSCRIPT, codes=tuple(map(tuple, frames)))
    by_codes = dataclasses.replace(by_audio, request_id="codes", context=(turn,))
    audio = run_streams(engine, [(0, by_audio), (0, by_codes)])
    np.testing.assert_array_equal(audio["codes"], audio["audio"])


def test_a_cloned_voice_resumed_within_its_lead_in_goes_on_as_it_would_have(engine) -> None:
    """A resumed stream's rows are replayed through the layout: the clip's last frames that the
    first rows carry must be what the layout forces there."""

    def outputs(request: SynthesisRequest) -> list:
        engine.add_request(request)
        collected = []
        while engine.has_unfinished_requests():
            collected += [o for o in engine.step() if o.request_id == request.request_id]
        engine.check_integrity()
        assert collected[-1].finished and collected[-1].error is None
        return collected

    request = cloning("whole", TEXTS[2], clip(17, seed=4), 10, engine)
    whole = outputs(request)
    rows = np.concatenate([o.rows for o in whole if o.rows is not None])
    assert (rows[:15, 1:] < 1024).all(), "the late codebooks open with the clip's codes, not BOS"
    point = ResumePoint(tuple(map(tuple, rows[:9].tolist())), 0)
    tail = outputs(dataclasses.replace(request, request_id="tail", resume=point))
    np.testing.assert_array_equal(
        np.concatenate([o.rows for o in tail if o.rows is not None]), rows[9:]
    )
    np.testing.assert_array_equal(
        np.concatenate([o.audio for o in tail]), np.concatenate([o.audio for o in whole])
    )


def test_a_cloned_voice_keys_its_kv_by_the_transcript(engine) -> None:
    voice = clip(4)
    first = engine.intake.speech(cloning("a", TEXTS[0], voice, 8, engine))
    other = dataclasses.replace(
        cloning("b", TEXTS[0], voice, 8, engine),
        context=(ContextTurn("default", "[S2] Something else.", audio=voice.tobytes()),),
    )
    second = engine.intake.speech(other)
    assert first.token_rows == second.token_rows
    assert first.extra_keys != second.extra_keys
    assert first.conditioning is not None
    assert first.conditioning.context_texts == (TRANSCRIPT,)
    assert len(first.conditioning.context_frames) == 4


def _turn_request(turn: ContextTurn, **fields: object) -> SynthesisRequest:
    base = SynthesisRequest(
        "bad", TEXTS[0], "default", 0.5, GUIDED, prompt_sample_rate=SAMPLING_RATE, context=(turn,)
    )
    return dataclasses.replace(base, **fields)  # type: ignore[arg-type]


VOICE = clip(3).tobytes()


@pytest.mark.parametrize(
    ("request_", "message"),
    [
        (
            _turn_request(
                ContextTurn("default", TRANSCRIPT, audio=VOICE), prompt_sample_rate=24000
            ),
            "audio must be at the codec's 44100 Hz",
        ),
        (_turn_request(ContextTurn("default", " ", audio=VOICE)), "turn 0 has no transcript"),
        (_turn_request(ContextTurn("default", TRANSCRIPT)), "turn 0 has no audio"),
        (
            _turn_request(ContextTurn("default", "[S1] " + "x" * 1100, audio=VOICE)),
            "the transcripts and the text: 1123 bytes; Dia's encoder reads at most 1024",
        ),
        (
            _turn_request(
                ContextTurn("default", TRANSCRIPT, audio=np.zeros(21 * 44100, "<f4").tobytes())
            ),
            "context turn 0 is 21.0 s of audio; the limit is 20.0 s",
        ),
        (
            _turn_request(ContextTurn("default", TRANSCRIPT, codes=((7,) * 9,) * 3100)),
            "the prompt takes 3101 of the model's 3072 positions",
        ),
        (
            _turn_request(ContextTurn("default", TRANSCRIPT, audio=VOICE), prompt_audio=VOICE),
            "turn 1 has no transcript",
        ),
    ],
)
def test_a_clip_dia_cannot_clone_is_refused_with_the_reason(engine, request_, message) -> None:
    with pytest.raises(RequestRejected, match=re.escape(message)):
        engine.add_request(request_)
    assert not engine.has_unfinished_requests()
    engine.check_integrity()


def test_two_texts_never_share_kv_through_the_prefix_cache(engine) -> None:
    first = engine.intake.speech(SynthesisRequest("a", TEXTS[0], "default", 0.5, GREEDY))
    second = engine.intake.speech(SynthesisRequest("b", TEXTS[1], "default", 0.5, GREEDY))
    assert first.token_rows == second.token_rows
    assert first.extra_keys != second.extra_keys


def test_the_guided_branch_doubles_the_paged_kv_and_the_state_is_its_own_class(engine) -> None:
    spec = engine.model.spec
    assert engine.kv_cache.spec.num_layers == 2 * spec.decoder.num_layers
    per_stream = engine.model.state_bytes_per_stream
    element = torch.empty((), dtype=torch.float32).element_size()
    cross = spec.cross_num_kv_heads * spec.cross_head_dim * element
    assert per_stream == 2 * spec.decoder.num_layers * spec.encoder.max_positions * 2 * cross
    assert engine.info.sampling_fields == ("guidance_scale",)


def test_a_guided_decode_step_reads_the_device_once(checkpoint) -> None:
    # The delay pattern's masks are planned on the host once; the one read is the rows.
    assert checkpoint_step_reads(checkpoint, TEXTS[:2]) == {"tolist": 4}
