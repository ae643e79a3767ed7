"""Dia on the paged engine against ``transformers``: greedy speech with classifier-free guidance
equals ``DiaForConditionalGeneration.generate`` + the DAC decode on tiny random checkpoints in
the public layout, alone and with other streams joining and leaving; what Dia cannot take is
refused by name; the KV pool is intact after every scenario."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from cadenza.contract.errors import RequestRejected
from cadenza.contract.request import SynthesisRequest
from cadenza.contract.sampling import SamplingParams
from cadenza.engine.engine import Engine
from cadenza.engine.models.dia import dia_text_ids
from cadenza.engine.offline import synthesize
from tests.support.dia_checkpoints import (
    reference_dia_generate,
    reference_text_ids,
    tiny_dia_checkpoint,
)
from tests.support.float32_compute import float32_cpu_config

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


def test_a_speech_prompt_is_refused(engine) -> None:
    audio = np.zeros(4410, dtype="<f4").tobytes()
    request = SynthesisRequest(
        "bad", "hi", "default", 0.5, GREEDY, prompt_audio=audio, prompt_sample_rate=44100
    )
    with pytest.raises(RequestRejected, match="no speech prompt"):
        engine.add_request(request)
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
