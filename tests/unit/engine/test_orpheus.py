"""Orpheus checkpoints against transformers (and the ``snac`` package for the audio):
recognised from their own files, the exact prompt, greedy tokens identical with and without
repetition penalty under batching, chunked prefill and prefix caching, and the whole pipeline
equal to transformers' generate followed by SNAC's offline decode (the SNAC checkpoint with its
weight norm under the legacy names it is published with)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from cadenza.config import EngineConfig
from cadenza.contract.request import SynthesisRequest
from cadenza.contract.sampling import SamplingParams
from cadenza.engine.engine import Engine
from cadenza.engine.models import orpheus
from cadenza.engine.models.checkpoint import CheckpointError
from cadenza.engine.models.registry import load_model
from cadenza.engine.offline import synthesize
from tests.support.float32_compute import assert_float32_named_with_the_fused_step
from tests.support.legacy_weight_norm import legacy_weight_norm_names
from tests.unit.codecs.test_snac import SMALL, _reference, _silence_noise
from tests.unit.engine.orpheus_checkpoints import (
    reference_frames,
    reference_prompt,
    reference_tokens,
    run_to_the_end,
    save_tiny_orpheus,
)

snac = pytest.importorskip("snac")

FRAMES = 4  # max_duration_s 0.35 at 11.72 frames/s


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    directory = tmp_path_factory.mktemp("orpheus")
    model = save_tiny_orpheus(directory)
    from transformers import PreTrainedTokenizerFast

    return directory, model, PreTrainedTokenizerFast.from_pretrained(directory)


@pytest.fixture(scope="module")
def snac_dir(tmp_path_factory):
    """A small SNAC saved as hubertsiuzdak/snac_24khz is: weight norm under its legacy names."""
    directory = tmp_path_factory.mktemp("snac")
    reference = _reference(SMALL, seed=5)
    (directory / "config.json").write_text(json.dumps(SMALL))
    state = legacy_weight_norm_names(reference.state_dict())
    assert any(name.endswith(".weight_g") for name in state)
    torch.save(state, directory / "pytorch_model.bin")
    _silence_noise(reference)
    return directory, reference


def _engine(directory, codec, **config) -> Engine:
    defaults = {"page_size": 8, "kv_cache_memory_bytes": 8 << 20}
    return Engine.from_pretrained(
        str(directory),
        dtype="float32",  # named: float32 products and cache, as transformers computes
        codec=str(codec),
        codec_noise=False,
        engine_config=EngineConfig(**{**defaults, **config}),
    )


def _greedy(penalty: float) -> SamplingParams:
    return SamplingParams(temperature=0.0, top_k=0, repetition_penalty=penalty)


def test_recognised_from_its_own_files(checkpoint) -> None:
    directory, _, tokenizer = checkpoint
    model = load_model(str(directory), seed=0, device=torch.device("cpu"), dtype=torch.float32)
    assert model.family == "orpheus" and model.codec_name == orpheus.SNAC_CODEC
    assert model.voices == tuple(orpheus.VOICES)
    assert model.default_sampling == SamplingParams(
        temperature=0.6, top_p=0.8, repetition_penalty=1.3
    )
    prompt = [row[0] for row in model.build_prompt("Hello there, friend.", "leo")]
    assert prompt == reference_prompt(tokenizer, "leo", "Hello there, friend.")
    assert prompt[1] == 128000  # the tokenizer's BOS, after start-of-human


def test_explicit_declaration_overrides_recognition(checkpoint, tmp_path) -> None:
    directory, _, _ = checkpoint
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
        (tmp_path / name).write_bytes((directory / name).read_bytes())
    (tmp_path / "cadenza.json").write_text(json.dumps({"preset": "orpheus", "voices": ["ava"]}))
    model = load_model(str(tmp_path), seed=0, device=torch.device("cpu"), dtype=torch.float32)
    assert model.voices == ("ava",) and model.family == "orpheus"
    (tmp_path / "cadenza.json").write_text(json.dumps({"preset": "bark"}))
    with pytest.raises(CheckpointError, match="unknown preset"):
        load_model(str(tmp_path), seed=0, device=torch.device("cpu"), dtype=torch.float32)


@pytest.mark.parametrize("penalty", [1.0, 1.3])
def test_greedy_tokens_equal_transformers_batched_chunked_and_prefix_cached(
    checkpoint, snac_dir, penalty
) -> None:
    directory, reference, tokenizer = checkpoint
    texts = [("tara", "Hi."), ("leo", "Good morning to you all."), ("tara", "Hi there.")]
    engine = _engine(
        directory,
        snac_dir[0],
        max_num_batched_tokens=16,
        max_num_seqs=4,
        enable_prefix_caching=True,
    )
    requests = [
        SynthesisRequest(f"r{i}", text, voice, 0.35, _greedy(penalty))
        for i, (voice, text) in enumerate(texts)
    ]
    first = run_to_the_end(engine, requests[:1])
    rest = run_to_the_end(engine, requests[1:])  # the second "tara" prompt starts from cached pages
    got = {**first, **rest}
    for i, (voice, text) in enumerate(texts):
        prompt = reference_prompt(tokenizer, voice, text)
        assert got[f"r{i}"] == reference_tokens(reference, prompt, FRAMES * 7, penalty)
    assert engine.stats().prefix_hit_tokens > 0
    assert_float32_named_with_the_fused_step(engine)


def test_text_to_audio_equals_transformers_then_snac(checkpoint, snac_dir) -> None:
    directory, reference, tokenizer = checkpoint
    snac_dir, snac_reference = snac_dir
    engine = _engine(directory, snac_dir)
    audio = synthesize(
        engine, "Good morning.", voice="mia", max_duration_s=0.35, sampling=_greedy(1.1)
    )
    tokens = reference_tokens(
        reference, reference_prompt(tokenizer, "mia", "Good morning."), FRAMES * 7, 1.1
    )
    codes = reference_frames(tokens)
    with torch.no_grad():
        levels = [codes[:, 0], codes[:, 1:3].transpose(1, 2).reshape(1, -1)]
        levels.append(codes[:, 3:7].transpose(1, 2).reshape(1, -1))
        expected = snac_reference.decode(levels)[0, 0].numpy()
    assert audio.shape == expected.shape == (len(tokens) // 7 * 2048,)  # to its end of speech
    np.testing.assert_allclose(audio, expected, atol=5e-5, rtol=1e-4)


def test_unknown_voice_is_refused_with_the_list(checkpoint, snac_dir) -> None:
    directory, _, _ = checkpoint
    engine = _engine(directory, snac_dir[0])
    with pytest.raises(Exception, match="tara"):
        engine.add_request(SynthesisRequest("r", "Hello.", "nobody", 0.35))
    engine.check_integrity()


def test_chunks_are_sized_in_snac_frames(checkpoint, snac_dir) -> None:
    engine = _engine(checkpoint[0], snac_dir[0])
    # the first chunk waits for SNAC's 3 frames of lookahead, then brings one frame of audio
    assert (engine.frames.first_chunk_frames, engine.frames.chunk_frames) == (4, 2)


def test_a_stop_id_ends_the_speech_at_a_frame_boundary(checkpoint, snac_dir) -> None:
    directory, reference, tokenizer = checkpoint
    prompt = reference_prompt(tokenizer, "leo", "Good morning to you all.")
    tokens = reference_tokens(reference, prompt, FRAMES * 7, 1.0)
    mid_frame, boundary = tokens[3], tokens[7]  # position 3 of frame 0; position 0 of frame 1
    engine = _engine(directory, snac_dir[0])
    sampling = SamplingParams(temperature=0.0, top_k=0, stop_ids=(mid_frame, boundary))
    got = run_to_the_end(
        engine, [SynthesisRequest("r", "Good morning to you all.", "leo", 0.35, sampling)]
    )
    assert got["r"] == tokens[:8]  # the mid-frame id did not stop it; the boundary one did


@pytest.mark.parametrize(
    "sampling",
    [_greedy(1.1), SamplingParams(seed=3, temperature=0.8, top_k=40, repetition_penalty=1.1)],
)
def test_a_resumed_stream_goes_on_with_the_same_tokens_and_audio(
    checkpoint, snac_dir, sampling
) -> None:
    from cadenza.contract.request import ResumePoint
    from tests.unit.engine.test_resume import _audio, _codes, _outputs, _rows

    engine = _engine(checkpoint[0], snac_dir[0])
    text = "Good morning to you all."
    whole = _outputs(engine, SynthesisRequest("whole", text, "leo", 1.5, sampling))
    head = _outputs(engine, SynthesisRequest("head", text, "leo", 1.5, sampling), stop_after=3)
    point = ResumePoint(tuple(map(tuple, _rows(head).tolist())), len(_codes(head)))
    tail = _outputs(engine, SynthesisRequest("head", text, "leo", 1.5, sampling, resume=point))
    assert len(_codes(head)) > 0 and len(_codes(tail)) > 0
    np.testing.assert_array_equal(np.concatenate([_rows(head), _rows(tail)]), _rows(whole))
    np.testing.assert_array_equal(np.concatenate([_codes(head), _codes(tail)]), _codes(whole))
    joined = np.concatenate([_audio(head), _audio(tail)])
    np.testing.assert_allclose(joined, _audio(whole), atol=1e-5)


def test_admission_reads_the_first_chunk_with_snac_s_lookahead_from_the_engine(
    checkpoint, snac_dir
) -> None:
    """The engine announces its first chunk as its deadline policy runs it, SNAC's look-ahead
    included; the edge's capacity model computes with exactly that, never the configured
    75 Hz frames."""
    from cadenza.config import AdmissionConfig
    from cadenza.edge.admission.capacity import CapacityModel
    from cadenza.engine.layouts.token_layout import layout_steps_for_frames

    engine = _engine(checkpoint[0], snac_dir[0])
    plan = engine.info.realtime
    policy = engine.policy
    assert policy is not None
    assert plan.lookahead_frames == 3
    assert plan.first_chunk_frames == policy.first_chunk_frames == 4  # 1 of audio + 3 ahead
    assert plan.first_chunk_steps == layout_steps_for_frames(engine.layout, 4) == 28
    assert plan.step_budget_s == pytest.approx(policy.step_budget_s)
    capacity = CapacityModel(engine.info, AdmissionConfig())
    assert capacity.plan == plan
    assert capacity.step_budget_ms == pytest.approx(1000 * policy.step_budget_s)
