"""MusicGen on the paged engine against ``transformers``: greedy music with classifier-free
guidance has exactly the codes of ``MusicgenForConditionalGeneration.generate`` on a tiny random
checkpoint in the public layout, alone and with other streams joining and leaving, guided or
not; ``D`` seconds are ``D * 50`` frames; its T5 encoder and tokenizer are ``transformers``';
what MusicGen cannot take is refused by name; the KV pool is intact after every scenario. The
audio is the checkpoint's own EnCodec (the codec the model names: its directory) streaming
what ``generate`` decodes at once."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from transformers import AutoTokenizer, MusicgenForConditionalGeneration, T5Config, T5EncoderModel

from cadenza.contract.errors import RequestRejected
from cadenza.contract.request import SynthesisRequest
from cadenza.contract.sampling import SamplingParams
from cadenza.engine.engine import Engine
from cadenza.engine.models.checkpoint import CheckpointError
from cadenza.engine.models.registry import (
    load_checkpoint,
    paged_backbone_config,
    stream_state_bytes,
)
from cadenza.engine.models.t5_encoder import T5Encoder, T5EncoderSpec
from cadenza.engine.offline import synthesize
from tests.support.float32_compute import float32_cpu_config
from tests.support.musicgen_checkpoints import (
    CODEBOOK_SIZE,
    FRAME_RATE,
    NUM_CODEBOOKS,
    max_new_tokens_for,
    reference_musicgen_generate,
    tiny_musicgen_checkpoint,
)
from tests.support.step_audit import checkpoint_step_reads

TEXTS = ("calm piano with soft drums", "heavy techno beat, fast and loud", "sad jazz guitar")
GREEDY = SamplingParams(temperature=0.0)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    return tiny_musicgen_checkpoint(tmp_path_factory.mktemp("musicgen") / "musicgen-tiny")


@pytest.fixture(scope="module")
def engine(checkpoint) -> Engine:
    return Engine.from_pretrained(str(checkpoint), dtype="float32", cpu=float32_cpu_config())


@cache
def reference(directory: Path, text: str, scale: float, frames: int) -> tuple[torch.Tensor, Any]:
    """``transformers``' codes ``[K, frames]`` and audio for ``text`` alone."""
    [(codes, audio)] = reference_musicgen_generate(
        directory, [text], guidance_scale=scale, max_new_tokens=max_new_tokens_for(frames)
    )
    assert codes.shape == (NUM_CODEBOOKS, frames)
    return codes, audio


def run_streams(
    engine: Engine, requests: list[tuple[int, SynthesisRequest]]
) -> dict[str, tuple[torch.Tensor, np.ndarray]]:
    """Each request added at its step; every stream's codes ``[K, frames]`` and audio."""
    pending = sorted(requests, key=lambda item: item[0])
    codes: dict[str, list[np.ndarray]] = {request.request_id: [] for _, request in requests}
    audio: dict[str, list[np.ndarray]] = {request.request_id: [] for _, request in requests}
    step = 0
    while pending or engine.has_unfinished_requests():
        while pending and pending[0][0] <= step:
            engine.add_request(pending.pop(0)[1])
        for output in engine.step():
            assert output.error is None, output.error
            audio[output.request_id].append(output.audio)
            if output.codes is not None:
                codes[output.request_id].append(output.codes.astype(np.int64))
        step += 1
    engine.check_integrity()
    return {
        key: (torch.from_numpy(np.concatenate(codes[key])).T, np.concatenate(audio[key]))
        for key in codes
    }


def music(engine: Engine, text: str, seconds: float, sampling: SamplingParams) -> torch.Tensor:
    request = SynthesisRequest("one", text, "default", seconds, sampling)
    return run_streams(engine, [(0, request)])["one"][0]


def test_the_text_encoder_and_tokenizer_are_transformers(checkpoint, engine) -> None:
    transformers_model: Any = MusicgenForConditionalGeneration.from_pretrained(checkpoint)
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    for text in (*TEXTS, ""):
        ids = tokenizer(text, return_tensors="pt").input_ids
        assert engine.model.text_ids(text) == ids[0].tolist()
        with torch.no_grad():
            expected = transformers_model.text_encoder(input_ids=ids).last_hidden_state
            ours = engine.model.text_encoder(ids)
        torch.testing.assert_close(ours, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("feed_forward_proj", ["relu", "gated-gelu"])
def test_the_t5_encoder_is_transformers_over_long_distances(feed_forward_proj: str) -> None:
    config = T5Config(
        vocab_size=64,
        d_model=32,
        d_kv=8,
        d_ff=48,
        num_layers=2,
        num_heads=4,
        relative_attention_num_buckets=32,
        relative_attention_max_distance=20,
        feed_forward_proj=feed_forward_proj,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        expected_model: Any = T5EncoderModel(config).eval()
    spec = T5EncoderSpec.from_config(config.to_dict())
    ours = T5Encoder(spec).eval()
    state = expected_model.state_dict()
    state.pop("encoder.embed_tokens.weight", None)
    ours.load_state_dict(state, strict=True)
    ids = torch.randint(0, 64, (1, 60), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = expected_model(input_ids=ids).last_hidden_state
        torch.testing.assert_close(ours(ids), expected, atol=1e-5, rtol=1e-5)


def test_greedy_guided_music_equals_transformers(checkpoint, engine) -> None:
    seconds = 0.3
    frames = round(seconds * FRAME_RATE)
    codes, _ = reference(checkpoint, TEXTS[0], 3.0, frames)
    ours = music(engine, TEXTS[0], seconds, GREEDY.with_overrides(guidance_scale=3.0))
    assert ours.shape == (NUM_CODEBOOKS, frames)
    assert torch.equal(ours, codes)


def test_the_published_guidance_scale_is_the_default(checkpoint, engine) -> None:
    codes, _ = reference(checkpoint, TEXTS[0], 3.0, 15)
    assert torch.equal(music(engine, TEXTS[0], 0.3, GREEDY), codes)


def test_unguided_music_equals_transformers_at_scale_one(checkpoint, engine) -> None:
    codes, _ = reference(checkpoint, TEXTS[1], 1.0, 20)
    ours = music(engine, TEXTS[1], 0.4, GREEDY.with_overrides(guidance_scale=1.0))
    assert torch.equal(ours, codes)
    guided, _ = reference(checkpoint, TEXTS[1], 3.0, 20)
    assert not torch.equal(guided, codes), "the checkpoint should tell the scales apart"


def test_streams_joining_and_leaving_each_equal_their_own_reference(checkpoint, engine) -> None:
    streams = (  # start step, text, guidance, frames
        (0, TEXTS[0], 3.0, 15),
        (4, TEXTS[1], 1.0, 20),
        (9, TEXTS[2], 3.0, 25),
    )
    requests = [
        (start, SynthesisRequest(f"s{i}", text, "default", frames / FRAME_RATE, sampling))
        for i, (start, text, scale, frames) in enumerate(streams)
        for sampling in [GREEDY.with_overrides(guidance_scale=scale)]
    ]
    results = run_streams(engine, requests)
    for i, (_, text, scale, frames) in enumerate(streams):
        codes, audio = reference(checkpoint, text, scale, frames)
        assert torch.equal(results[f"s{i}"][0], codes), f"stream s{i}"
        np.testing.assert_allclose(results[f"s{i}"][1], audio, atol=2e-5)


def test_the_description_does_not_set_the_length(engine) -> None:
    """A short description lasts exactly its max_duration_s (D x 50 frames), longer than its
    text would make a speech stream; without one, what generate makes by default."""
    codes = music(engine, TEXTS[2], 1.2, GREEDY)
    assert codes.shape == (NUM_CODEBOOKS, round(1.2 * FRAME_RATE))
    seq = engine.intake.speech(SynthesisRequest("default", TEXTS[2], "default", None, GREEDY))
    assert seq.target_frames == round(engine.model.default_duration_s * FRAME_RATE)
    assert engine.info.default_duration_s == engine.model.default_duration_s


def test_sampled_music_only_ever_holds_codes(engine) -> None:
    sampling = engine.model.default_sampling.with_overrides(seed=7)
    assert (sampling.temperature, sampling.top_k) == (1.0, 250)
    codes = music(engine, TEXTS[2], 0.2, sampling)
    assert codes.shape == (NUM_CODEBOOKS, 10)
    assert int(codes.max()) < CODEBOOK_SIZE


def test_the_audio_is_transformers(checkpoint, engine) -> None:
    _, audio = reference(checkpoint, TEXTS[0], 3.0, 15)
    ours = synthesize(engine, TEXTS[0], max_duration_s=0.3, sampling=GREEDY)
    assert ours.shape == audio.shape
    np.testing.assert_allclose(ours, audio, atol=2e-5)
    engine.check_integrity()


@pytest.mark.parametrize(
    ("text", "sampling", "message"),
    [
        ("hi", SamplingParams(fine_temperature=0.5), "fine_temperature: musicgen does not take"),
        ("hi", SamplingParams(guidance_scale=0.5), "guidance_scale: .* at least 1"),
        ("x" * 600, GREEDY, "reads at most 512"),
    ],
)
def test_what_musicgen_cannot_take_is_refused_with_the_reason(
    engine, text, sampling, message
) -> None:
    with pytest.raises(RequestRejected, match=message):
        engine.add_request(SynthesisRequest("bad", text, "default", 0.2, sampling))
    engine.check_integrity()


def test_an_audio_prompt_is_refused(engine) -> None:
    audio = np.zeros(3200, dtype="<f4").tobytes()
    request = SynthesisRequest(
        "bad", "hi", "default", 0.2, GREEDY, prompt_audio=audio, prompt_sample_rate=32000
    )
    with pytest.raises(RequestRejected, match="no audio prompt"):
        engine.add_request(request)
    engine.check_integrity()


def test_two_descriptions_never_share_kv_through_the_prefix_cache(engine) -> None:
    first = engine.intake.speech(SynthesisRequest("a", TEXTS[0], "default", 0.2, GREEDY))
    second = engine.intake.speech(SynthesisRequest("b", TEXTS[1], "default", 0.2, GREEDY))
    assert first.token_rows == second.token_rows
    assert first.extra_keys != second.extra_keys
    engine.check_integrity()


def test_both_branches_are_paged_and_the_cross_attention_is_the_stream_state(
    checkpoint, engine
) -> None:
    decoder = engine.model.spec.decoder
    assert engine.kv_cache.spec.num_layers == 2 * decoder.num_layers
    assert paged_backbone_config(str(checkpoint)).num_layers == 2 * decoder.num_layers
    per_token = 2 * decoder.hidden_size * torch.empty((), dtype=torch.float32).element_size()
    expected = decoder.num_layers * 512 * per_token  # the tokenizer's model_max_length
    assert engine.model.state_bytes_per_stream == expected
    assert stream_state_bytes(str(checkpoint), torch.float32) == expected
    assert engine.info.sampling_fields == ("guidance_scale",)


def test_a_config_without_its_decoder_is_refused(checkpoint, tmp_path) -> None:
    config = json.loads((checkpoint / "config.json").read_text())
    del config["decoder"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="invalid MusicGen config"):
        load_checkpoint(tmp_path, torch.device("cpu"), torch.float32)


def test_a_guided_decode_step_reads_the_device_once(checkpoint) -> None:
    # The delay pattern's masks are planned on the host once; the one read is the rows.
    assert checkpoint_step_reads(checkpoint, TEXTS[:2]) == {"tolist": 4}
