"""Sesame CSM checkpoints against transformers' ``CsmForConditionalGeneration``: loaded from
the public layout, the exact prompt, greedy frames (backbone and depth decoder) identical
under batching of streams at different positions, chunked prefill and prefix caching, a
context turn with audio, seeded sampling independent of the batch, a resumed stream, and the
whole pipeline text to audio equal to the reference's generate with ``output_audio``."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from cadenza.config import EngineConfig
from cadenza.contract.errors import RequestRejected
from cadenza.contract.request import ContextTurn, ResumePoint, SynthesisRequest
from cadenza.contract.sampling import SamplingParams
from cadenza.engine.engine import Engine
from cadenza.engine.models import csm
from cadenza.engine.models.checkpoint import CheckpointError
from cadenza.engine.models.registry import load_model
from cadenza.engine.offline import synthesize
from tests.support.float32_compute import assert_float32_named_with_the_fused_step
from tests.support.step_audit import checkpoint_step_reads
from tests.unit.engine.csm_checkpoints import (
    reference_generate,
    reference_prompt_ids,
    save_tiny_csm,
)
from tests.unit.engine.test_resume import _audio, _codes, _outputs, _rows

FRAMES = 5
DURATION_S = FRAMES / 12.5
GREEDY = SamplingParams(temperature=0.0, top_k=0)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    directory = tmp_path_factory.mktemp("csm")
    return directory, save_tiny_csm(directory)


_REFERENCE: dict[tuple, list[list[int]]] = {}


def reference_frames(model, ids: list[int], frames: int = FRAMES, audio=None) -> list[list[int]]:
    """transformers' greedy frames for prompt ``ids`` (cached per prompt)."""
    key = (tuple(ids), frames, None if audio is None else audio.shape)
    if key not in _REFERENCE:
        _REFERENCE[key] = reference_generate(model, ids, frames, audio)[0].tolist()
    return _REFERENCE[key]


def _engine(directory, **config) -> Engine:
    defaults = {"page_size": 8, "kv_cache_memory_bytes": 8 << 20}
    return Engine.from_pretrained(
        str(directory),
        dtype="float32",  # named: float32 products and cache, as transformers computes
        engine_config=EngineConfig(**{**defaults, **config}),
    )


def _run(engine: Engine, requests: list[SynthesisRequest], stagger: int = 0) -> dict:
    seqs = {}
    for request in requests:
        engine.add_request(request)
        seqs[request.request_id] = engine.sequence(request.request_id)
        for _ in range(stagger):  # the next stream joins a batch already decoding
            engine.step()
    while engine.has_unfinished_requests():
        engine.step()
    engine.check_integrity()
    return {rid: [list(row) for row in seq.output_rows] for rid, seq in seqs.items()}


def test_loaded_from_the_public_layout(checkpoint) -> None:
    directory, _ = checkpoint
    model = load_model(str(directory), seed=0, device=torch.device("cpu"), dtype=torch.float32)
    assert model.family == "csm" and model.codec_name == str(directory)
    assert model.voices == ("0", "1") and model.depth is not None
    assert model.default_sampling == SamplingParams(temperature=0.9, top_k=50)
    prompt = model.build_prompt("Hello there, friend.", "1")
    assert [row[0] for row in prompt] == reference_prompt_ids(
        directory, "Hello there, friend.", "1"
    )
    assert all(row[1:] == [-1] * 31 for row in prompt)  # text rows


def test_a_broken_checkpoint_is_refused_with_the_reason(checkpoint, tmp_path) -> None:
    directory, _ = checkpoint
    import json

    config = json.loads((directory / "config.json").read_text())
    del config["depth_decoder_config"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="depth_decoder_config"):
        load_model(str(tmp_path), seed=0, device=torch.device("cpu"), dtype=torch.float32)


def test_greedy_frames_equal_transformers_batched_staggered_chunked_and_prefix_cached(
    checkpoint,
) -> None:
    directory, reference = checkpoint
    texts = [("0", "Hi."), ("1", "Good morning to you all, my friends."), ("0", "Hi there.")]
    engine = _engine(
        directory,
        max_num_batched_tokens=16,
        max_num_seqs=4,
        page_size=4,
        enable_prefix_caching=True,
    )
    requests = [
        SynthesisRequest(f"r{i}", text, voice, DURATION_S, GREEDY)
        for i, (voice, text) in enumerate(texts)
    ]
    first = _run(engine, requests[:1])
    rest = _run(engine, requests[1:], stagger=2)  # "[0]Hi" starts from the cached page
    got = {**first, **rest}
    for i, (voice, text) in enumerate(texts):
        expected = reference_frames(reference, reference_prompt_ids(directory, text, voice))
        assert got[f"r{i}"] == expected
    assert engine.stats().prefix_hit_tokens > 0
    assert_float32_named_with_the_fused_step(engine)


def test_a_context_turn_with_audio_equals_transformers(checkpoint) -> None:
    directory, reference = checkpoint
    engine = _engine(directory)
    audio = np.random.default_rng(0).uniform(-0.5, 0.5, 4 * 1920).astype(np.float32)
    turn = ContextTurn(voice="1", text="How are you?", audio=audio.tobytes())
    request = SynthesisRequest("r", "Fine.", "0", DURATION_S, GREEDY, context=(turn,))
    got = _run(engine, [request])["r"]
    with torch.no_grad():
        frames = reference.codec_model.encode(torch.from_numpy(audio)[None, None]).audio_codes
    num_frames = frames.shape[-1]
    ids = [
        *reference_prompt_ids(directory, "How are you?", "1"),
        *[128002] * num_frames,
        128003,
        *reference_prompt_ids(directory, "Fine.", "0"),
    ]
    assert got == reference_frames(reference, ids, audio=audio)


def test_context_given_as_codes_is_the_same_prompt_and_reuses_the_cache(checkpoint) -> None:
    directory, _ = checkpoint
    engine = _engine(directory, page_size=4, enable_prefix_caching=True)
    first = _run(engine, [SynthesisRequest("a", "Hello.", "0", DURATION_S, GREEDY)])["a"]
    turn = ContextTurn(voice="0", text="Hello.", codes=tuple(map(tuple, first)))
    before = engine.stats().prefix_hit_tokens
    second = _run(engine, [SynthesisRequest("b", "Bye.", "0", DURATION_S, GREEDY, context=(turn,))])
    # the first turn's prompt and its generated frames (all but the last) were still cached
    prompt_rows = len(reference_prompt_ids(directory, "Hello.", "0"))
    assert engine.stats().prefix_hit_tokens - before >= (prompt_rows + FRAMES - 1) // 4 * 4
    assert len(second["b"]) == FRAMES


def test_seeded_sampling_does_not_depend_on_the_batch(checkpoint) -> None:
    directory, _ = checkpoint
    sampling = SamplingParams(seed=7, temperature=0.9, top_k=50)
    alone = _run(_engine(directory), [SynthesisRequest("a", "Hi.", "0", DURATION_S, sampling)])
    others = [
        SynthesisRequest(f"o{i}", "Other words.", "1", DURATION_S, SamplingParams(seed=i))
        for i in range(2)
    ]
    batched = _run(
        _engine(directory),
        [others[0], SynthesisRequest("a", "Hi.", "0", DURATION_S, sampling), others[1]],
        stagger=1,
    )
    assert batched["a"] == alone["a"]


@pytest.mark.parametrize("sampling", [GREEDY, SamplingParams(seed=3, temperature=0.9, top_k=50)])
def test_a_resumed_stream_goes_on_with_the_same_frames_and_audio(checkpoint, sampling) -> None:
    engine = _engine(checkpoint[0])
    request = SynthesisRequest("whole", "Good morning.", "1", 1.2, sampling)
    whole = _outputs(engine, request)
    head_request = SynthesisRequest("head", "Good morning.", "1", 1.2, sampling)
    head = _outputs(engine, head_request, stop_after=2)
    point = ResumePoint(tuple(map(tuple, _rows(head).tolist())), len(_codes(head)))
    tail = _outputs(
        engine, SynthesisRequest("head", "Good morning.", "1", 1.2, sampling, resume=point)
    )
    np.testing.assert_array_equal(np.concatenate([_rows(head), _rows(tail)]), _rows(whole))
    joined = np.concatenate([_audio(head), _audio(tail)])
    np.testing.assert_allclose(joined, _audio(whole), atol=1e-5)


def test_text_to_audio_equals_transformers_generate_with_audio(checkpoint) -> None:
    directory, reference = checkpoint
    engine = _engine(directory)
    audio = synthesize(
        engine, "Good morning.", voice="0", max_duration_s=DURATION_S, sampling=GREEDY
    )
    ids = reference_prompt_ids(directory, "Good morning.", "0")
    expected = reference_generate(reference, ids, FRAMES, output_audio=True)[0].numpy()
    assert audio.shape == expected.shape == (FRAMES * 1920,)
    # cadenza clips to [-1, 1] (a random codec overshoots it)
    np.testing.assert_allclose(audio, np.clip(expected, -1.0, 1.0), atol=1e-4)


def test_garbage_voices_and_context_are_refused(checkpoint) -> None:
    engine = _engine(checkpoint[0])
    bad = [
        SynthesisRequest("a", "Hi.", "7", DURATION_S),
        SynthesisRequest("b", "Hi.", "0", DURATION_S, context=(ContextTurn(voice="x"),)),
        SynthesisRequest(
            "c", "Hi.", "0", DURATION_S, context=(ContextTurn(voice="1", codes=((1, 2),)),)
        ),
        SynthesisRequest(
            "d", "Hi.", "0", DURATION_S, context=(ContextTurn(voice="1", codes=((5000,) * 32,)),)
        ),
        SynthesisRequest(
            "e", "Hi.", "0", DURATION_S, context=(ContextTurn(voice="1", audio=b"abc"),)
        ),
    ]
    for request in bad:
        with pytest.raises(RequestRejected):
            engine.add_request(request)
    engine.check_integrity()
    assert engine.num_requests == 0


def test_speakers_come_from_cadenza_json(checkpoint, tmp_path) -> None:
    directory, _ = checkpoint
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
        (tmp_path / name).write_bytes((directory / name).read_bytes())
    (tmp_path / "cadenza.json").write_text('{"voices": ["0", "1", "4"]}')
    model = load_model(str(tmp_path), seed=0, device=torch.device("cpu"), dtype=torch.float32)
    assert model.voices == ("0", "1", "4")
    (tmp_path / "cadenza.json").write_text('{"voices": ["alice"]}')
    with pytest.raises(CheckpointError, match="speaker ids"):
        load_model(str(tmp_path), seed=0, device=torch.device("cpu"), dtype=torch.float32)
    assert csm.SPEAKERS == ("0", "1")


def test_the_models_positions_bound_the_utterance(checkpoint, tmp_path) -> None:
    import json

    directory, _ = checkpoint
    for name in ("model.safetensors", "tokenizer.json"):
        (tmp_path / name).write_bytes((directory / name).read_bytes())
    config = json.loads((directory / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 16}))
    engine = _engine(tmp_path)
    got = _run(engine, [SynthesisRequest("a", "Hi.", "0", 10.0, GREEDY)])["a"]
    # 1 s (12 frames) asked; 8 positions left after the prompt
    assert len(got) == 16 - len(reference_prompt_ids(directory, "Hi.", "0")) == 8
    with pytest.raises(RequestRejected, match="no room"):
        engine.add_request(SynthesisRequest("b", "x" * 20, "0", 1.0, GREEDY))
    engine.check_integrity()


def test_nan_in_the_depth_decoder_fails_only_its_stream(checkpoint) -> None:
    engine = _engine(checkpoint[0])
    depth = engine.model.depth_decoder
    head = depth.head

    def poisoned(hidden, codebook):
        logits = head(hidden, codebook)
        if codebook == 5 and poisoned.on:
            logits[0] = float("nan")  # the first stream of the batch
        return logits

    poisoned.on = True
    depth.head = poisoned
    requests = [SynthesisRequest(f"r{i}", "Hi.", "0", DURATION_S, GREEDY) for i in range(2)]
    outputs = []
    for request in requests:
        engine.add_request(request)
    while engine.has_unfinished_requests():
        outputs += engine.step()
        poisoned.on = False  # once is enough
    endings = {o.request_id: o for o in outputs if o.finished}
    assert endings["r0"].error_code == "internal" and "NaN" in endings["r0"].error
    assert endings["r1"].finish_reason is not None and endings["r1"].error is None
    engine.check_integrity()


def test_bf16_weights_keep_float32_rotary_and_tied_codebook_embeddings(checkpoint) -> None:
    directory, _ = checkpoint
    model = load_model(str(directory), seed=0, device=torch.device("cpu"), dtype=torch.bfloat16)
    assert model.backbone_model.rotary.inv_freq.dtype == torch.float32
    assert model.depth_decoder.transformer.rotary.inv_freq.dtype == torch.float32
    embeddings = model.embed_audio_tokens.weight
    assert model.depth_decoder.embed_tokens.weight.data_ptr() == embeddings.data_ptr()


def test_a_resume_point_with_ids_the_model_cannot_emit_is_refused(checkpoint) -> None:
    engine = _engine(checkpoint[0])
    point = ResumePoint(((2050,) * 32,), 0)  # the pad id: never sampled
    with pytest.raises(RequestRejected, match="could not emit"):
        engine.add_request(SynthesisRequest("r", "Hi.", "0", DURATION_S, GREEDY, resume=point))
    engine.check_integrity()


def test_plan_reads_the_paged_backbone_of_a_csm_checkpoint(checkpoint) -> None:
    from cadenza.engine.models.registry import paged_backbone_config

    shape = paged_backbone_config(str(checkpoint[0]))
    assert (shape.num_layers, shape.num_kv_heads, shape.head_dim) == (2, 2, 16)


@pytest.mark.parametrize("sampling", [GREEDY, SamplingParams(top_k=0, top_p=0.9, seed=4)])
def test_a_decode_step_through_the_depth_decoder_reads_the_device_once(
    checkpoint, sampling
) -> None:
    # Every level's ids stay on the device; the step's one read is the rows with their flags.
    settings = EngineConfig(page_size=8, kv_cache_memory_bytes=8 << 20)
    texts = ["Hi there."] * 3
    reads = checkpoint_step_reads(checkpoint[0], texts, "0", sampling, engine_config=settings)
    assert reads == {"tolist": 4}
