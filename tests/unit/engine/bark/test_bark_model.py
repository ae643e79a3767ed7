"""Bark on the batching engine against ``transformers``' ``BarkModel.generate`` on tiny random
checkpoints: every frame's codes identical and audio within 1e-4 for streams that join at
different steps with chunked prefill (every context restarting in the paged KV; windows a tenth
of the published ones, so that a stream runs through many coarse and several fine windows), and
from a checkpoint with the published windows and the codec's weight norm under its legacy names;
seeded sampling reproducible and independent of the batch; a stream resumed from the frames its
listener heard continues the same audio; bad requests refused; the KV pool whole after every
scenario."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from safetensors import safe_open
from transformers import BarkModel, BarkProcessor
from transformers.models.bark.generation_configuration_bark import (
    BarkCoarseGenerationConfig,
    BarkFineGenerationConfig,
    BarkSemanticGenerationConfig,
)

from cadenza.config import EngineConfig
from cadenza.contract.errors import RequestRejected
from cadenza.contract.request import FinishReason, ResumePoint, SynthesisRequest
from cadenza.contract.sampling import SamplingParams
from cadenza.engine.engine import Engine
from tests.unit.engine.bark.bark_checkpoints import SHORT_VOICE, VOICE, build_tiny_bark

LONG = "hello world the quick brown fox jumps over lazy dog"
GREEDY = SamplingParams(temperature=0.0)
SEMANTIC_HZ, FRAME_HZ = 49.9, 75.0


def seconds_for(semantic_tokens: int) -> float:
    """A stream length whose semantic-token cap is exactly ``semantic_tokens``."""
    return math.floor(semantic_tokens * FRAME_HZ / SEMANTIC_HZ) / FRAME_HZ


@pytest.fixture(scope="module")
def tiny_bark(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, BarkModel]:
    directory = tmp_path_factory.mktemp("bark")
    return directory, build_tiny_bark(directory, small_windows=True)


def _engine(directory: Path, **engine: Any) -> Engine:
    config = EngineConfig(
        **({"max_num_batched_tokens": 100, "kv_cache_memory_bytes": 64 << 20} | engine)
    )
    return Engine.from_pretrained(str(directory), dtype="float32", engine_config=config)


@pytest.fixture(scope="module")
def engine(tiny_bark: tuple[Path, BarkModel]) -> Engine:
    return _engine(tiny_bark[0])


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
    return {"fine": fine[0], "audio": audio[0].float().numpy()}


class _Streams:
    """Streams on one engine, stepped together; each one's audio, codes and ending."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.audio: dict[str, list[np.ndarray]] = {}
        self.codes: dict[str, list[np.ndarray]] = {}
        self.endings: dict[str, FinishReason] = {}
        self.first_audio_in_coarse: dict[str, bool] = {}

    def add(self, request: SynthesisRequest) -> None:
        self.engine.add_request(request)
        self.audio[request.request_id], self.codes[request.request_id] = [], []

    def step(self) -> None:
        for output in self.engine.step():
            rid = output.request_id
            self.audio[rid].append(output.audio)
            if output.codes is not None:
                self.codes[rid].append(output.codes)
            if output.audio.size and rid not in self.first_audio_in_coarse:
                live = self.engine.sequence(rid)
                state = None if live is None else live.model_state
                stage = getattr(getattr(state, "stage", None), "value", None)
                self.first_audio_in_coarse[rid] = stage == "coarse"
            if output.finish_reason is not None:
                self.endings[rid] = output.finish_reason
                self.engine.check_integrity()

    def run(self) -> None:
        while self.engine.has_unfinished_requests():
            self.step()
        self.engine.check_integrity()

    def audio_of(self, request_id: str) -> np.ndarray:
        return np.concatenate(self.audio[request_id])

    def codes_of(self, request_id: str) -> np.ndarray:
        return np.concatenate(self.codes[request_id])


def _request(rid: str, text: str, voice: str, semantic: int, **sampling: Any) -> SynthesisRequest:
    params = GREEDY.with_overrides(**sampling) if sampling else GREEDY
    return SynthesisRequest(rid, text, voice, seconds_for(semantic), params)


def test_streams_joining_at_different_steps_match_transformers(
    tiny_bark: tuple[Path, BarkModel], engine: Engine
) -> None:
    directory, model = tiny_bark
    asked = {
        "long": (LONG, VOICE, 160),
        "short": ("hello world", SHORT_VOICE, 90),
        "plain": ("the fox speaks", "default", 50),
    }
    streams = _Streams(engine)
    streams.add(_request("long", *asked["long"]))
    for _ in range(7):
        streams.step()
    streams.add(_request("short", *asked["short"]))
    for _ in range(40):
        streams.step()
    streams.add(_request("plain", *asked["plain"]))
    streams.run()
    assert engine.kv.pool.num_free_pages == engine.kv.pool.num_pages
    for rid, (text, voice, cap) in asked.items():
        expected = reference(model, directory, text, None if voice == "default" else voice, cap)
        assert streams.endings[rid] in (FinishReason.EOS, FinishReason.LENGTH)
        codes = streams.codes_of(rid)
        assert np.array_equal(codes.T, expected["fine"].numpy())
        audio = streams.audio_of(rid)
        assert audio.shape == expected["audio"].shape
        np.testing.assert_allclose(audio, np.clip(expected["audio"], -1, 1), atol=1e-4)
    # Long enough for several fine windows (history 64 + frames > 128): their first audio
    # came while their coarse windows still ran; a stream of one fine window speaks at its end.
    assert 64 + streams.codes_of("long").shape[0] > 2 * 128
    assert streams.first_audio_in_coarse == {"long": True, "short": True, "plain": False}


def test_a_checkpoint_with_legacy_weight_norm_names_speaks_as_transformers(
    tmp_path: Path,
) -> None:
    """suno/bark stores its codec's weight norm as ``weight_g`` / ``weight_v``; its windows
    are the published ones."""
    model = build_tiny_bark(tmp_path, legacy_weight_norm=True)
    (weights,) = tmp_path.glob("*.safetensors")
    with safe_open(weights, "pt") as handle:
        names = list(handle.keys())
    assert any(name.startswith("codec_model.") and name.endswith(".weight_g") for name in names)
    assert not any(".parametrizations." in name for name in names)
    streams = _Streams(_engine(tmp_path))
    streams.add(_request("a", "hello world", VOICE, 60))
    streams.run()
    expected = reference(model, tmp_path, "hello world", VOICE, 60)
    audio = streams.audio_of("a")
    assert audio.shape == expected["audio"].shape and audio.size > 0
    np.testing.assert_allclose(audio, np.clip(expected["audio"], -1, 1), atol=1e-4)


def test_seeded_sampling_is_reproducible_and_independent_of_the_batch(engine: Engine) -> None:
    sampled = {"temperature": 0.7, "fine_temperature": 0.5, "seed": 11}
    alone = _Streams(engine)
    alone.add(_request("alone", "hello world", VOICE, 40, **sampled))
    alone.run()
    crowd = _Streams(engine)
    crowd.add(_request("other", "the quick brown fox", "default", 30, temperature=1.0, seed=3))
    crowd.step()
    crowd.add(_request("target", "hello world", VOICE, 40, **sampled))
    crowd.add(_request("third", "lazy dog", VOICE, 20))
    crowd.run()
    assert np.array_equal(crowd.codes_of("target"), alone.codes_of("alone"))
    again = _Streams(engine)
    again.add(_request("reseeded", "hello world", VOICE, 40, **(sampled | {"seed": 12})))
    again.run()
    assert not np.array_equal(again.codes_of("reseeded"), alone.codes_of("alone"))


def test_a_resumed_stream_is_made_again_and_goes_on_after_what_was_heard(engine: Engine) -> None:
    """A stream moved from a lost engine resumes from the frames its listener heard (its
    outputs carry no rows: each context's are its own): it is made again from its start (an
    unseeded one from its request id's seed) and its listener gets the rest of the same audio."""
    sampled = {"temperature": 0.8}
    whole = _Streams(engine)
    whole.add(_request("moved", LONG, VOICE, 160, **sampled))
    whole.run()
    audio, codes = whole.audio_of("moved"), whole.codes_of("moved")
    heard_frames = sum(len(c) for c in whole.codes["moved"][:1])
    assert 0 < heard_frames < len(codes)
    heard_samples = whole.audio["moved"][0].size
    request = _request("moved", LONG, VOICE, 160, **sampled)
    resumed = _Streams(engine)
    resumed.add(SynthesisRequest(**{**request.__dict__, "resume": ResumePoint((), heard_frames)}))
    resumed.run()
    assert np.array_equal(resumed.codes_of("moved"), codes[heard_frames:])
    np.testing.assert_allclose(resumed.audio_of("moved"), audio[heard_samples:], atol=1e-5)
    with pytest.raises(RequestRejected, match="frames heard, not rows"):
        engine.add_request(
            SynthesisRequest(**{**request.__dict__, "resume": ResumePoint(((1,),), 1)})
        )
    engine.check_integrity()


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"voice": "v2/xx_speaker_9"}, "unknown voice"),
        ({"text": "   "}, "needs some text"),
        ({"text": "hello " * 300}, "reads at most 256"),
        ({"sampling": GREEDY.with_overrides(guidance_scale=3.0)}, "guidance_scale"),
        ({"prompt_audio": np.zeros(2400, np.float32).tobytes()}, "no speech prompt"),
    ],
)
def test_bad_requests_are_refused(engine: Engine, change: dict[str, Any], reason: str) -> None:
    request = SynthesisRequest(**(_request("bad", "hello", VOICE, 20).__dict__ | change))
    with pytest.raises(RequestRejected, match=reason):
        engine.add_request(request)
    assert engine.num_requests == 0
    engine.check_integrity()


def test_a_cancel_mid_coarse_frees_its_pages_and_codec_slot(engine: Engine) -> None:
    streams = _Streams(engine)
    streams.add(_request("cancelled", "hello world", VOICE, 30))
    while True:
        streams.step()
        seq = engine.sequence("cancelled")
        assert seq is not None
        if getattr(seq.model_state, "coarse", None) and seq.num_generated > 3:
            break
    assert engine.abort_request("cancelled")
    streams.step()
    assert streams.endings["cancelled"] is FinishReason.CANCELLED
    assert engine.kv.pool.num_free_pages == engine.kv.pool.num_pages
    assert not engine.audio.decoder.open_slots  # type: ignore[union-attr]
    engine.check_integrity()


def test_a_stream_reserves_one_context_not_its_whole_length(engine: Engine) -> None:
    """Contexts restart (the semantic tokens, then each coarse window), so a stream holds at
    most the longest context's pages, what admission prices too."""
    streams = _Streams(engine)
    streams.add(_request("long", LONG, VOICE, 700))
    seq = engine.sequence("long")
    assert seq is not None
    context = engine.layout.max_context  # type: ignore[attr-defined]
    assert context == 256 + 1 + 768
    pages = -(-context // engine.kv.page_size)
    assert engine.kv.reservation(seq) == pages
    assert engine.info.shape.pages(300, 10_000) == pages
    assert engine.abort_request("long")
    streams.step()
    engine.check_integrity()


def test_it_announces_its_voices_fields_and_the_bark_package_s_sampling(engine: Engine) -> None:
    info = engine.info
    assert info.voices == ("default", SHORT_VOICE, VOICE)
    assert info.sample_rate == 24_000 and info.segments_text
    assert info.sampling_fields == ("fine_temperature",)
    assert info.default_sampling.temperature == 0.7 and info.default_sampling.top_k == 0


@pytest.mark.parametrize(
    ("sampling", "fine"),
    [
        (GREEDY, None),  # greedy all through
        (GREEDY.with_overrides(temperature=0.7), 0.5),  # Bark's own fine temperature
        (GREEDY.with_overrides(temperature=0.7, fine_temperature=0.0), None),
        (GREEDY.with_overrides(fine_temperature=0.3), 0.3),
    ],
)
def test_the_fine_stage_samples_at_its_own_temperature(
    engine: Engine, sampling: SamplingParams, fine: float | None
) -> None:
    from cadenza.engine.models.stream_state import StreamConditioning

    state = engine.model.begin_stream(StreamConditioning("hello", VOICE, sampling))
    assert state.fine_temperature == fine


def test_the_calibration_measures_a_prompt_row_in_chunks_of_bark_s_fixed_prompt(
    tiny_bark: tuple[Path, BarkModel],
) -> None:
    """Every Bark text is one 257-row prompt (padded), so prompts of three lengths say nothing
    of a row's cost: the calibration prefills one in chunks instead, and the fit recovers a
    row's cost from them. The steps are what the scheduler makes of Bark's prompt at each
    chunk size (a chunk a step), at a known cost (0.5 ms + 0.02 ms a row): the fit is checked,
    not this machine's noise (Bark's chunked prefill itself is tested against transformers)."""
    from cadenza.contract.engine_stats import StepRecord
    from cadenza.engine.realtime import calibration

    asked: list[int] = []

    def chunked(engine: Engine, request: SynthesisRequest, steps: int) -> list[StepRecord]:
        rows = len(engine.intake.speech(request).token_rows)  # its prompt, as admitted
        chunk = engine.scheduler.max_num_batched_tokens
        asked.append(chunk)
        records, done = [], 0
        for _ in range(steps):
            tokens = min(chunk, rows - done)
            if tokens <= 0:
                break
            done += tokens
            records.append(StepRecord((0.5 + 0.02 * tokens) / 1000, 0, tokens, done))
        return records

    engine = _engine(tiny_bark[0], max_num_batched_tokens=512)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(calibration, "_prefill_steps", chunked)
        fitted = calibration._measure_prefill(engine)
    assert len(set(asked)) == 4  # whole prompts, then chunks of three sizes
    assert fitted is not None
    per_row, per_position = fitted
    assert per_row == pytest.approx(0.02, rel=0.05) and per_position == pytest.approx(0, abs=1e-6)
