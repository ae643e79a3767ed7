"""Bark batched across streams against ``transformers``' ``BarkModel.generate`` on a tiny random
checkpoint: semantic, coarse and fine tokens identical and audio within 1e-4 for streams that
join at different steps with chunked prefill, and from a checkpoint with the codec's weight norm
under its legacy names (as published); seeded sampling reproducible and independent of
the batch; bad requests refused."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors import safe_open
from transformers import BarkModel, BarkProcessor
from transformers.models.bark.generation_configuration_bark import (
    BarkCoarseGenerationConfig,
    BarkFineGenerationConfig,
    BarkSemanticGenerationConfig,
)

from cadenza.engine.models.bark.bark_batch import BarkBatch
from cadenza.engine.models.bark.bark_checkpoint import BarkCheckpoint, load_bark
from cadenza.engine.models.bark.bark_request import (
    BarkRequest,
    BarkRequestError,
    BarkResult,
    BarkSampling,
)
from tests.unit.engine.bark.bark_checkpoints import SHORT_VOICE, VOICE, build_tiny_bark

LONG = "hello world the quick brown fox jumps over lazy dog"


@pytest.fixture(scope="module")
def tiny_bark(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, BarkModel]:
    directory = tmp_path_factory.mktemp("bark")
    return directory, build_tiny_bark(directory)


@pytest.fixture(scope="module")
def bark(tiny_bark: tuple[Path, BarkModel]) -> BarkCheckpoint:
    return load_bark(tiny_bark[0], torch.device("cpu"), torch.float32)


def reference(
    model: BarkModel, directory: Path, text: str, voice: str | None, max_semantic: int
) -> dict[str, Any]:
    """Each stage's tokens and the audio as ``BarkModel.generate`` makes them, one request."""
    processor = BarkProcessor.from_pretrained(str(directory))
    inputs = processor(text, voice_preset=voice)
    history = inputs.get("history_prompt")
    gen = model.generation_config
    semantic_config = BarkSemanticGenerationConfig(**gen.semantic_config)
    coarse_config = BarkCoarseGenerationConfig(**gen.coarse_acoustics_config)
    fine_config = BarkFineGenerationConfig(**gen.fine_acoustics_config)
    with torch.no_grad():
        semantic = model.semantic.generate(
            inputs["input_ids"],
            history_prompt=history,
            semantic_generation_config=semantic_config,
            attention_mask=inputs["attention_mask"],
            min_eos_p=None,
            max_new_tokens=max_semantic,
        )
        tokens = [t for t in semantic[0].tolist() if t != semantic_config.semantic_pad_token]
        coarse = model.coarse_acoustics.generate(
            semantic.clone(),
            semantic_generation_config=semantic_config,
            coarse_generation_config=coarse_config,
            codebook_size=1024,
            history_prompt=history,
        )
        fine = model.fine_acoustics.generate(
            coarse,
            semantic_generation_config=semantic_config,
            coarse_generation_config=coarse_config,
            fine_generation_config=fine_config,
            codebook_size=1024,
            history_prompt=history,
        )
        audio = model.generate(
            inputs["input_ids"],
            attention_mask=inputs["attention_mask"],
            history_prompt=history,
            semantic_max_new_tokens=max_semantic,
        )
    return {"semantic": tokens, "fine": fine[0], "audio": audio[0]}


def test_streams_joining_at_different_steps_match_transformers(
    tiny_bark: tuple[Path, BarkModel], bark: BarkCheckpoint
) -> None:
    directory, model = tiny_bark
    requests = [
        BarkRequest(LONG, VOICE, BarkSampling(max_semantic_tokens=400)),
        BarkRequest("hello world", SHORT_VOICE, BarkSampling(max_semantic_tokens=90)),
        BarkRequest("the fox speaks", None, BarkSampling(max_semantic_tokens=50)),
    ]
    batch = BarkBatch(bark, prefill_chunk=100)
    results: dict[int, BarkResult] = {}
    ids = [batch.add(requests[0])]
    pieces: dict[int, list[torch.Tensor]] = {}
    first_audio_while_coarse: dict[int, bool] = {}

    def step() -> None:
        for chunk in batch.step():
            pieces.setdefault(chunk.stream_id, []).append(chunk.audio)
            if chunk.audio.numel():
                coarse = batch.stage_of(chunk.stream_id) == "coarse"
                first_audio_while_coarse.setdefault(chunk.stream_id, coarse)
            if chunk.result is not None:
                results[chunk.stream_id] = chunk.result

    for _ in range(7):
        step()
    ids.append(batch.add(requests[1]))
    for _ in range(40):
        step()
    ids.append(batch.add(requests[2]))
    while batch.active:
        step()
    assert batch.active == 0
    assert batch.semantic_kv.slots_in_use == 0 and batch.coarse_kv.slots_in_use == 0
    assert batch.codec_slots_in_use == 0
    for stream_id, request in zip(ids, requests, strict=True):
        ours = results[stream_id]
        cap = request.sampling.max_semantic_tokens
        assert cap is not None
        expected = reference(model, directory, request.text, request.voice, cap)
        assert ours.semantic == expected["semantic"]
        assert torch.equal(ours.fine, expected["fine"].to(ours.fine.dtype))
        assert torch.equal(ours.coarse, ours.fine[:2])
        assert ours.audio.shape == expected["audio"].shape
        assert torch.allclose(ours.audio, expected["audio"].float(), atol=1e-4)
        assert torch.equal(torch.cat(pieces[stream_id]), ours.audio)
    long = results[ids[0]]
    # Long enough for two fine windows (history 450 + frames > 1024) and many coarse ones;
    # its first window's audio came while its coarse stage still ran, the others' after.
    assert 450 + long.fine.shape[1] > 1024
    assert first_audio_while_coarse == {ids[0]: True, ids[1]: False, ids[2]: False}


def test_a_checkpoint_with_legacy_weight_norm_names_speaks_as_transformers(
    tmp_path: Path,
) -> None:
    """suno/bark stores its codec's weight norm as ``weight_g`` / ``weight_v``."""
    model = build_tiny_bark(tmp_path, legacy_weight_norm=True)
    (weights,) = tmp_path.glob("*.safetensors")
    with safe_open(weights, "pt") as handle:
        names = list(handle.keys())
    assert any(name.startswith("codec_model.") and name.endswith(".weight_g") for name in names)
    assert not any(".parametrizations." in name for name in names)
    bark = load_bark(tmp_path, torch.device("cpu"), torch.float32)
    ours = _run_alone(bark, BarkRequest("hello world", VOICE, BarkSampling(max_semantic_tokens=60)))
    expected = reference(model, tmp_path, "hello world", VOICE, 60)
    assert ours.semantic == expected["semantic"]
    assert torch.equal(ours.fine, expected["fine"].to(ours.fine.dtype))
    assert ours.audio.shape == expected["audio"].shape and ours.audio.numel() > 0
    assert torch.allclose(ours.audio, expected["audio"].float(), atol=1e-4)


def test_seeded_sampling_is_reproducible_and_independent_of_the_batch(
    bark: BarkCheckpoint,
) -> None:
    sampling = BarkSampling(
        semantic_temperature=0.7,
        coarse_temperature=0.7,
        fine_temperature=0.5,
        max_semantic_tokens=40,
        seed=11,
    )
    request = BarkRequest("hello world", VOICE, sampling)
    alone = _run_alone(bark, request)
    crowd = BarkBatch(bark, prefill_chunk=64)
    crowd.add(
        BarkRequest(
            "the quick brown fox",
            None,
            BarkSampling(semantic_temperature=1.0, max_semantic_tokens=30, seed=3),
        )
    )
    crowd.step()
    target = crowd.add(request)
    crowd.add(BarkRequest("lazy dog", VOICE, BarkSampling(max_semantic_tokens=20)))
    in_crowd = {r.stream_id: r for r in crowd.run()}[target]
    assert in_crowd.semantic == alone.semantic
    assert torch.equal(in_crowd.fine, alone.fine)
    other = _run_alone(
        bark, BarkRequest("hello world", VOICE, BarkSampling(**{**sampling.__dict__, "seed": 12}))
    )
    assert other.semantic != alone.semantic


def _run_alone(bark: BarkCheckpoint, request: BarkRequest) -> BarkResult:
    batch = BarkBatch(bark)
    batch.add(request)
    return batch.run()[0]


def test_min_eos_p_ends_the_semantic_tokens(bark: BarkCheckpoint) -> None:
    result = _run_alone(bark, BarkRequest("hello", VOICE, BarkSampling(min_eos_p=1e-12)))
    assert result.semantic == []
    assert result.fine.shape == (8, 0) and result.audio.numel() == 0


@pytest.mark.parametrize(
    ("request_", "param"),
    [
        (BarkRequest("hello", "v2/xx_speaker_9"), "voice"),
        (BarkRequest("   ", VOICE), "text"),
        (BarkRequest("hello " * 300, VOICE), "text"),
        (
            BarkRequest("hello", VOICE, BarkSampling(semantic_temperature=0.0)),
            "semantic_temperature",
        ),
        (
            BarkRequest("hello", VOICE, BarkSampling(fine_temperature=float("nan"))),
            "fine_temperature",
        ),
        (BarkRequest("hello", VOICE, BarkSampling(min_eos_p=1.5)), "min_eos_p"),
        (BarkRequest("hello", VOICE, BarkSampling(max_semantic_tokens=0)), "max_semantic_tokens"),
        (BarkRequest("hello", VOICE, BarkSampling(max_semantic_tokens=769)), "max_semantic_tokens"),
        (BarkRequest("hello", VOICE, BarkSampling(seed=-1)), "seed"),
    ],
)
def test_bad_requests_are_refused(bark: BarkCheckpoint, request_: BarkRequest, param: str) -> None:
    batch = BarkBatch(bark)
    with pytest.raises(BarkRequestError) as error:
        batch.add(request_)
    assert error.value.param == param
    assert batch.active == 0 and batch.semantic_kv.slots_in_use == 0


def test_cancel_frees_the_slot(bark: BarkCheckpoint) -> None:
    batch = BarkBatch(bark)
    stream = batch.add(BarkRequest("hello world", VOICE, BarkSampling(max_semantic_tokens=30)))
    for _ in range(40):
        batch.step()
    assert batch.stage_counts()["coarse"] == 1
    batch.cancel(stream)
    batch.cancel(stream)
    assert batch.active == 0 and batch.coarse_kv.slots_in_use == 0
    assert batch.codec_slots_in_use == 0


def test_a_full_batch_refuses_more_streams(bark: BarkCheckpoint) -> None:
    batch = BarkBatch(bark, max_streams=1)
    batch.add(BarkRequest("hello", VOICE, BarkSampling(max_semantic_tokens=5)))
    with pytest.raises(BarkRequestError) as error:
        batch.add(BarkRequest("hello", VOICE))
    assert error.value.param == "streams"
    assert len(batch.run()) == 1 and batch.codec_slots_in_use == 0
