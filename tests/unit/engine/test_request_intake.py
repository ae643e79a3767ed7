"""Request intake: speech and token requests become sequences or raise RequestRejected."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from cadenza.config import LimitsConfig, RealtimeConfig
from cadenza.contract.errors import RequestRejected
from cadenza.contract.request import SynthesisRequest
from cadenza.contract.sampling import SamplingParams
from cadenza.engine.kv.paged_kv_cache import KVSpec
from cadenza.engine.layouts.token_layout import PlainLayout
from cadenza.engine.models.model import AudioTokenModel
from cadenza.engine.request_intake import RequestIntake
from cadenza.engine.sequence import SequenceStatus


@pytest.fixture
def intake(tiny_engine):
    """The tiny engine's intake (taking a request in changes no engine state)."""
    yield tiny_engine.intake
    tiny_engine.check_integrity()
    assert not tiny_engine.has_unfinished_requests()


class TextModel(AudioTokenModel):
    """A text LM's outline: the plain layout, 32 ids, EOS 2; intake never runs it."""

    def __init__(self) -> None:
        super().__init__()
        self.layout = PlainLayout()
        self.kv_spec = KVSpec(1, 1, 2)
        self.vocab_size = 32
        self.eos_ids = frozenset({2})
        self.anchor = nn.Parameter(torch.zeros(1))

    def forward(self, *args):
        raise AssertionError("intake never runs the model")


def text_intake() -> RequestIntake:
    return RequestIntake(
        TextModel(),
        None,
        extra_keys=("text-lm", "torch.float32"),
        realtime=RealtimeConfig(),
        limits=LimitsConfig(),
    )


# -- speech ---------------------------------------------------------------------------------


def test_a_speech_request_becomes_a_sequence_with_its_length_prompt_and_keys(
    intake, tiny_engine
) -> None:
    text = "x" * 42  # 3 s at 14 chars/s: 225 frames at 75 Hz
    seq = intake.speech(SynthesisRequest("r", text, sampling=SamplingParams(seed=11)))
    assert seq.request_id == "r" and seq.status is SequenceStatus.WAITING
    assert seq.target_frames == 225
    assert seq.max_new_steps == 225 + tiny_engine.layout.tail_steps
    assert seq.token_rows == tiny_engine.model.build_prompt(text, "default")
    assert seq.num_prompt_tokens == len(text) + 2  # BOS and the begin-audio row
    assert seq.extra_keys == (*intake.extra_keys, "voice=default")
    assert seq.num_computed_tokens == 0 and seq.page_table == []
    assert seq.generator.initial_seed() == 11
    assert seq.audio is not None
    assert seq.audio.codec_slot is None and seq.audio.frames_sent == 0
    playout = seq.audio.playout
    assert playout.ttfa_target_s == pytest.approx(tiny_engine.config.realtime.ttfa_target_ms / 1000)
    assert playout.frame_period_s == pytest.approx(1 / 75)
    assert playout.playout_start_s is None


@pytest.mark.parametrize(
    ("text", "max_duration_s", "frames"),
    [
        ("hi", None, 75),  # the one-second minimum
        ("x" * 28, None, 150),
        ("x" * 140, 0.5, round(0.5 * 75)),  # the request's own cap
        ("hi", 0.001, 0),  # rounds to no frames: no steps at all
    ],
)
def test_the_duration_sets_target_frames_and_the_step_budget(
    intake, tiny_engine, text, max_duration_s, frames
) -> None:
    seq = intake.speech(SynthesisRequest("r", text, max_duration_s=max_duration_s))
    assert seq.target_frames == frames
    expected_steps = frames + tiny_engine.layout.tail_steps if frames else 0
    assert seq.max_new_steps == expected_steps


def test_an_unknown_voice_is_rejected(intake) -> None:
    with pytest.raises(RequestRejected, match="unknown voice 'nobody'"):
        intake.speech(SynthesisRequest("r", "hello", voice="nobody"))


@pytest.mark.parametrize(
    "sampling", [SamplingParams(fine_temperature=0.5), SamplingParams(guidance_scale=3.0)]
)
def test_a_model_specific_field_is_refused_by_a_model_without_it(intake, sampling) -> None:
    field = "fine_temperature" if sampling.fine_temperature is not None else "guidance_scale"
    with pytest.raises(RequestRejected, match=f"{field}: .* does not take this sampling field"):
        intake.speech(SynthesisRequest("r", "hello", sampling=sampling))


def test_a_speech_prompt_becomes_codec_frames_before_the_text(intake, tiny_engine) -> None:
    rate = 24000
    audio = (0.3 * np.sin(np.arange(rate // 5) / rate * 2 * np.pi * 220)).astype("<f4")
    request = SynthesisRequest("r", "hi", prompt_audio=audio.tobytes(), prompt_sample_rate=rate)
    seq = intake.speech(request)
    frames = 15  # 0.2 s at 75 frames a second
    assert seq.num_prompt_tokens == frames + len("hi") + 2
    assert seq.token_rows[frames:] == tiny_engine.model.build_prompt("hi", "default")
    codebook_size = tiny_engine.audio.codec.codebook_size
    assert all(0 <= code < codebook_size for row in seq.token_rows[:frames] for code in row)


def test_a_speech_prompt_at_the_wrong_sample_rate_is_rejected(intake) -> None:
    audio = np.zeros(1600, "<f4").tobytes()
    request = SynthesisRequest("r", "hi", prompt_audio=audio, prompt_sample_rate=16000)
    with pytest.raises(RequestRejected, match="24000 Hz, not 16000 Hz"):
        intake.speech(request)


def test_a_speech_prompt_that_is_not_float32_or_too_long_is_rejected(intake) -> None:
    with pytest.raises(RequestRejected, match="float32"):
        intake.speech(SynthesisRequest("r", "hi", prompt_audio=b"\x00" * 6))
    too_long = np.zeros(24000 * 21, "<f4").tobytes()
    with pytest.raises(RequestRejected, match="limit"):
        intake.speech(SynthesisRequest("r", "hi", prompt_audio=too_long))


def test_the_same_seed_gives_the_same_generator_and_no_seed_a_fresh_one(intake) -> None:
    a = intake.speech(SynthesisRequest("a", "hi", sampling=SamplingParams(seed=5)))
    b = intake.speech(SynthesisRequest("b", "hi", sampling=SamplingParams(seed=5)))
    assert torch.equal(a.generator.get_state(), b.generator.get_state())
    c = intake.speech(SynthesisRequest("c", "hi"))
    d = intake.speech(SynthesisRequest("d", "hi"))
    assert c.generator.initial_seed() != d.generator.initial_seed()


def test_a_text_model_cannot_synthesize() -> None:
    with pytest.raises(RequestRejected, match="text model"):
        text_intake().speech(SynthesisRequest("r", "hello"))


# -- raw tokens -----------------------------------------------------------------------------


def test_prompt_rows_that_do_not_match_the_codebooks_are_rejected(intake) -> None:
    with pytest.raises(RequestRejected, match="codebooks"):
        intake.tokens("r", [[1024] * 8, [1024] * 3], 10, SamplingParams())
    with pytest.raises(RequestRejected, match="codebooks"):
        text_intake().tokens("r", [[1, 2]], 10, SamplingParams())


def test_an_empty_prompt_is_rejected(intake) -> None:
    with pytest.raises(RequestRejected, match="empty"):
        intake.tokens("r", [], 10, SamplingParams())


@pytest.mark.parametrize(("max_new_steps", "frames"), [(10, 3), (8, 1), (7, 0), (0, 0)])
def test_an_audio_token_request_gets_the_most_frames_its_steps_hold(
    intake, max_new_steps, frames
) -> None:
    seq = intake.tokens("r", [[1024] * 8], max_new_steps, SamplingParams(seed=1))
    assert seq.target_frames == frames  # 7 tail steps of the delay pattern come after
    assert seq.max_new_steps == max_new_steps
    assert seq.eos_ids == frozenset() and seq.audio is None
    assert seq.extra_keys == (*intake.extra_keys, "")


def test_a_text_token_request_stops_at_eos_or_max_new_steps() -> None:
    seq = text_intake().tokens("r", [[1], [5], [31]], 12, SamplingParams(seed=3))
    assert seq.token_rows == [[1], [5], [31]]
    assert seq.eos_ids == frozenset({2})
    assert seq.max_new_steps == 12 and seq.target_frames == 12
    assert seq.extra_keys == ("text-lm", "torch.float32", "")
    assert seq.generator.initial_seed() == 3


@pytest.mark.parametrize("bad_id", [32, 1000, -1])
def test_a_text_prompt_with_an_id_outside_the_vocabulary_is_rejected(bad_id) -> None:
    with pytest.raises(RequestRejected, match=r"\[0, 32\)"):
        text_intake().tokens("r", [[1], [bad_id], [3]], 4, SamplingParams())
