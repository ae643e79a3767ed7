"""The skeleton engine: lengths, chunking, reproducibility, cancellation, failure isolation."""

import time

import numpy as np
import pytest
import torch

from cadenza.contract.errors import RequestRejected
from cadenza.contract.request import FinishReason, SynthesisRequest
from cadenza.contract.sampling import SamplingParams
from cadenza.engine.engine import Engine
from cadenza.engine.offline import synthesize
from cadenza.kernels.native import loader
from tests.support.float32_compute import float32_cpu_config

HOP = 320


def _run(engine, *requests):
    for request in requests:
        engine.add_request(request)
    outputs = {}
    while engine.has_unfinished_requests():
        for output in engine.step():
            outputs.setdefault(output.request_id, []).append(output)
    return outputs


def _run_rows(engine, *requests):
    """``_run``'s outputs, and each request's generated token rows (in request order)."""
    for request in requests:
        engine.add_request(request)
    sequences = list(engine.scheduler.waiting)
    outputs = {}
    while engine.has_unfinished_requests():
        for output in engine.step():
            outputs.setdefault(output.request_id, []).append(output)
    return outputs, [list(seq.output_rows) for seq in sequences]


def test_duration_is_derived_from_text(tiny_engine):
    text = "x" * 42  # 42 chars at 14 chars/s: 3 s, 225 frames
    audio = synthesize(tiny_engine, text, sampling=SamplingParams(seed=1))
    assert len(audio) == 225 * HOP
    assert audio.dtype == np.float32
    assert np.abs(audio).max() <= 1.0
    assert audio.std() > 1e-4  # not silence


def test_short_text_gets_one_second_and_max_duration_caps(tiny_engine):
    assert len(synthesize(tiny_engine, "hi", sampling=SamplingParams(seed=1))) == 75 * HOP
    capped = synthesize(tiny_engine, "x" * 140, max_duration_s=0.5, sampling=SamplingParams(seed=1))
    assert len(capped) == round(0.5 * 75) * HOP


def test_same_seed_same_audio_other_seed_other_audio(tiny_engine):
    a = synthesize(tiny_engine, "reproducible", sampling=SamplingParams(seed=5))
    b = synthesize(tiny_engine, "reproducible", sampling=SamplingParams(seed=5))
    c = synthesize(tiny_engine, "reproducible", sampling=SamplingParams(seed=6))
    assert np.array_equal(a, b)
    assert not np.array_equal(a, c)


def test_chunks_stream_in_configured_sizes(tiny_engine):
    outputs = _run(tiny_engine, SynthesisRequest("r1", "x" * 28, sampling=SamplingParams(seed=2)))
    pieces = outputs["r1"]
    sizes = [len(p.audio) // HOP for p in pieces if len(p.audio)]
    first, chunk = tiny_engine.frames.first_chunk_frames, tiny_engine.frames.chunk_frames
    assert sizes[0] == first
    assert all(size == chunk for size in sizes[1:-1])
    assert sum(sizes) == 150
    assert pieces[-1].finish_reason is FinishReason.LENGTH
    assert all(not p.finished for p in pieces[:-1])


def test_requests_queue_and_all_finish(tiny_engine):
    requests = [SynthesisRequest(f"q{i}", "abc", sampling=SamplingParams(seed=i)) for i in range(3)]
    outputs = _run(tiny_engine, *requests)
    assert sorted(outputs) == ["q0", "q1", "q2"]
    for pieces in outputs.values():
        assert sum(len(p.audio) for p in pieces) == 75 * HOP
    assert tiny_engine.num_requests == 0
    tiny_engine.check_integrity()


def test_abort_ends_the_stream_with_cancelled(tiny_engine):
    tiny_engine.add_request(SynthesisRequest("gone", "x" * 100))
    for _ in range(5):
        tiny_engine.step()
    assert tiny_engine.abort_request("gone")
    assert not tiny_engine.abort_request("gone")
    final = tiny_engine.step()
    assert [(o.request_id, o.finish_reason) for o in final] == [("gone", FinishReason.CANCELLED)]
    assert not tiny_engine.has_unfinished_requests()


def test_bad_requests_are_refused_without_state_change(tiny_engine):
    with pytest.raises(RequestRejected, match="voice"):
        tiny_engine.add_request(SynthesisRequest("v", "hello", voice="nobody"))
    tiny_engine.add_request(SynthesisRequest("dup", "hello"))
    with pytest.raises(RequestRejected, match="duplicate"):
        tiny_engine.add_request(SynthesisRequest("dup", "hello"))
    tiny_engine.abort_request("dup")
    tiny_engine.step()
    assert tiny_engine.num_requests == 0


def _explode_on_byte_7(engine, monkeypatch) -> None:
    """Make ``engine``'s model raise on any forward pass that holds the byte 0x07 of a
    prompt (the rest of the batch then has to be retried alone)."""
    poison = engine.model.spec.audio_vocab_size + 7
    real_forward = engine.model.forward

    def forward(input_ids, *args):
        if bool((input_ids[:, 0] == poison).any()):
            raise RuntimeError("model exploded")
        return real_forward(input_ids, *args)

    monkeypatch.setattr(engine.model, "forward", forward)


def test_a_failing_request_fails_alone(tiny_engine, monkeypatch):
    _explode_on_byte_7(tiny_engine, monkeypatch)
    outputs = _run(
        tiny_engine,
        SynthesisRequest("good", "fine", sampling=SamplingParams(seed=1)),
        SynthesisRequest("bad", "poison \x07"),
        SynthesisRequest("good2", "also fine", sampling=SamplingParams(seed=2)),
    )
    assert outputs["bad"][-1].finish_reason is FinishReason.ERROR
    assert "exploded" in outputs["bad"][-1].error
    for request_id in ("good", "good2"):
        assert outputs[request_id][-1].finish_reason is FinishReason.LENGTH
        assert sum(len(p.audio) for p in outputs[request_id]) == 75 * HOP
    tiny_engine.check_integrity()


def test_nan_logits_fail_only_their_request(tiny_engine, monkeypatch):
    marker = tiny_engine.model.spec.audio_vocab_size + 8  # the byte 0x08
    real_forward = tiny_engine.model.forward

    def forward(input_ids, positions, context, kv_cache, logits_indices):
        logits = real_forward(input_ids, positions, context, kv_cache, logits_indices)
        if bool((input_ids[:, 0] == marker).any()) and len(logits_indices) == 1:
            return torch.full_like(logits, float("nan"))
        return logits

    monkeypatch.setattr(tiny_engine.model, "forward", forward)
    outputs = _run(
        tiny_engine,
        SynthesisRequest("nan", "\x08", sampling=SamplingParams(seed=1)),
    )
    assert outputs["nan"][-1].finish_reason is FinishReason.ERROR
    assert "NaN" in outputs["nan"][-1].error
    tiny_engine.check_integrity()


def test_zero_duration_finishes_at_once(tiny_engine):
    outputs = _run(tiny_engine, SynthesisRequest("z", "hi", max_duration_s=0.001))
    assert outputs["z"][-1].finish_reason is FinishReason.LENGTH
    assert sum(len(p.audio) for p in outputs["z"]) == 0


def test_speech_prompt_becomes_prompt_frames(tiny_engine):
    rate = 24000  # the codec's rate (the edge resamples microphone audio to it)
    audio = (0.3 * np.sin(np.arange(rate) / rate * 2 * np.pi * 200)).astype("<f4")
    request = SynthesisRequest(
        "prompted",
        "hi",
        prompt_audio=audio.tobytes(),
        prompt_sample_rate=rate,
        sampling=SamplingParams(seed=1),
    )
    tiny_engine.add_request(request)
    seq = tiny_engine.scheduler.waiting[-1]
    assert seq.num_prompt_tokens == 75 + 4  # 1 s of frames, BOS 'h' 'i', begin-audio
    outputs = _run(tiny_engine)
    assert outputs["prompted"][-1].finish_reason is FinishReason.LENGTH
    tiny_engine.check_integrity()


@pytest.mark.parametrize(
    ("audio", "rate", "message"),
    [
        (b"\x00\x01\x02", 24000, "float32"),
        (np.zeros(24000 * 21, "<f4").tobytes(), 24000, "limit"),
        (np.zeros(100, "<f4").tobytes(), 16000, "codec's 24000 Hz"),
    ],
)
def test_bad_speech_prompts_are_refused(tiny_engine, audio, rate, message):
    request = SynthesisRequest("bad-prompt", "hi", prompt_audio=audio, prompt_sample_rate=rate)
    with pytest.raises(RequestRejected, match=message):
        tiny_engine.add_request(request)
    assert tiny_engine.num_requests == 0


def test_a_request_without_a_decoder_slot_leaves_no_trace(tiny_engine, monkeypatch):
    from cadenza.codecs.codec import CodecError

    def no_slot(seq):
        raise CodecError("no free streaming slot")

    monkeypatch.setattr(tiny_engine.audio, "open", no_slot)
    with pytest.raises(CodecError):
        tiny_engine.add_request(SynthesisRequest("r1", "hello"))
    assert tiny_engine.sequence("r1") is None
    assert not tiny_engine.has_unfinished_requests()
    tiny_engine.check_integrity()


def test_a_stream_far_ahead_of_its_listener_lets_the_engine_wait(tiny_engine, monkeypatch):
    """Generating faster than real time, a stream gets ahead; past ``max_lead`` the engine may
    wait (the loop then leaves the CPU to the edge); a new request needs a step at once."""
    policy = tiny_engine.policy
    saved = policy.max_lead_s
    policy.max_lead_s = 0.3
    # A clock that runs slower than the engine however busy the machine is (each reading
    # advances it by a tenth of a millisecond), so the stream does get ahead.
    now = [time.monotonic()]

    def slow_clock() -> float:
        now[0] += 1e-4
        return now[0]

    monkeypatch.setattr(policy, "clock", slow_clock)
    monkeypatch.setattr(tiny_engine.audio, "clock", slow_clock)
    try:
        tiny_engine.add_request(SynthesisRequest("ahead", "x" * 70, max_duration_s=5.0))
        assert tiny_engine.idle_s() == 0.0  # prefilling
        for _ in range(200):
            tiny_engine.step()
            if tiny_engine.idle_s() > 0:
                break
        assert 0 < tiny_engine.idle_s() <= 5.0
        # A stream that far ahead has time to lend a new prompt's prefill (stats say how much).
        lent = tiny_engine.stats().spare_lead_s
        assert lent is not None and lent > 0.1
        tiny_engine.add_request(SynthesisRequest("new", "hello"))
        assert tiny_engine.idle_s() == 0.0
        assert tiny_engine.abort_request("ahead") and tiny_engine.abort_request("new")
        while tiny_engine.has_unfinished_requests():
            tiny_engine.step()
        tiny_engine.check_integrity()
    finally:
        policy.max_lead_s = saved


@pytest.fixture(scope="module")
def torch_decode_engine():
    """The tiny engine with decode steps on torch (the fused CPU decode off): the path that
    keeps the dense decode copy."""
    return Engine.from_pretrained(
        "cadenza-tiny",
        cpu=float32_cpu_config(fused_decode=False),
        device="cpu",
        seed=0,
        kv_cache_memory_bytes=64 << 20,
    )


@pytest.fixture
def dense_from_the_start(torch_decode_engine):
    """The tiny engine's dense decode copy in use from the first position (these streams are
    shorter than its usual threshold), restored afterwards."""
    dense = torch_decode_engine.runner.dense_kv
    assert dense is not None  # the CPU reads decode keys from the dense copy
    saved, dense.min_context = dense.min_context, 0
    yield dense
    dense.min_context = saved


def test_the_dense_decode_copy_follows_the_running_streams(
    torch_decode_engine, dense_from_the_start
):
    dense = dense_from_the_start
    for i in range(3):
        torch_decode_engine.add_request(
            SynthesisRequest(f"d{i}", "x" * 40, sampling=SamplingParams(seed=i))
        )
    for _ in range(6):
        torch_decode_engine.step()
    running = {seq.request_id for seq in dense.owners()}
    assert running == {"d0", "d1", "d2"}
    torch_decode_engine.abort_request("d1")
    torch_decode_engine.check_integrity()  # an aborted stream's row is released at once
    assert {seq.request_id for seq in dense.owners()} == {"d0", "d2"}
    while torch_decode_engine.has_unfinished_requests():
        torch_decode_engine.step()
    assert dense.owners() == {}
    torch_decode_engine.check_integrity()


def test_the_dense_decode_copy_and_page_gathering_give_the_same_audio(
    torch_decode_engine, dense_from_the_start
):
    requests = [
        SynthesisRequest(f"g{i}", "y" * (20 + 9 * i), sampling=SamplingParams(seed=i))
        for i in range(3)
    ]
    # Gathering first, the copy once the longest passes 60 positions (rows copied in then).
    dense_from_the_start.min_context = 60
    dense, dense_rows = _run_rows(torch_decode_engine, *requests)
    torch_decode_engine.runner.dense_kv = None
    try:
        gathered, gathered_rows = _run_rows(torch_decode_engine, *requests)
    finally:
        torch_decode_engine.runner.dense_kv = dense_from_the_start
    for ours_rows, theirs_rows in zip(dense_rows, gathered_rows, strict=True):
        assert len(ours_rows) == len(theirs_rows)
    for (request_id, pieces), ours_rows, theirs_rows in zip(
        dense.items(), dense_rows, gathered_rows, strict=True
    ):
        # The two read the same keys in another order of float sums: a sampled draw whose
        # uniform falls within that rounding of a boundary may flip (one codebook, once, late
        # in a stream) and the streams part there; a wrong key would part them at once.
        pairs = enumerate(zip(ours_rows, theirs_rows, strict=True))
        same = next((i for i, (a, b) in pairs if a != b), len(ours_rows))
        if same < len(ours_rows):
            assert same >= 100
            differing = sum(a != b for a, b in zip(ours_rows[same], theirs_rows[same], strict=True))
            assert differing == 1
        ours = np.concatenate([p.audio for p in pieces])
        theirs = np.concatenate([p.audio for p in gathered[request_id]])
        assert len(ours) == len(theirs)
        # audio up to a few frames before the parting (the codec's lookahead)
        end = max(0, same - 8) * HOP
        np.testing.assert_allclose(ours[:end], theirs[:end], atol=1e-4)


def test_after_a_failed_batch_the_dense_copy_gives_the_audio_gathering_gives(
    torch_decode_engine, dense_from_the_start, monkeypatch
):
    # Two streams decode from the copy, one of them still shorter than the copy's threshold;
    # a third's prompt makes the batched forward raise, and every sequence is retried alone
    # (the short one gathering). Rows the failed pass left half-written must not be trusted
    # afterwards: the audio equals the same scenario gathering pages.
    dense_from_the_start.min_context = 40
    _explode_on_byte_7(torch_decode_engine, monkeypatch)

    def scenario():
        outputs = {}
        for request_id, text, seed in (("ok1", "x" * 60, 1), ("ok2", "x" * 5, 2)):
            torch_decode_engine.add_request(
                SynthesisRequest(request_id, text, sampling=SamplingParams(seed=seed))
            )
        for _ in range(20):
            for output in torch_decode_engine.step():
                outputs.setdefault(output.request_id, []).append(output)
        for request_id, pieces in _run(
            torch_decode_engine, SynthesisRequest("bad", "\x07 x")
        ).items():
            outputs.setdefault(request_id, []).extend(pieces)
        torch_decode_engine.check_integrity()
        return outputs

    dense = scenario()
    torch_decode_engine.runner.dense_kv = None
    try:
        gathered = scenario()
    finally:
        torch_decode_engine.runner.dense_kv = dense_from_the_start
    assert dense["bad"][-1].finish_reason is FinishReason.ERROR
    for request_id in ("ok1", "ok2"):
        ours = np.concatenate([p.audio for p in dense[request_id]])
        theirs = np.concatenate([p.audio for p in gathered[request_id]])
        assert len(ours) == len(theirs) > 0
        np.testing.assert_allclose(ours, theirs, atol=1e-4)


@pytest.mark.skipif(
    loader.load("cpu_decode_layers") is None,
    reason="no C++ compiler on this machine: the fused CPU decode is not built",
)
def test_the_fused_cpu_decode_and_the_torch_path_give_the_same_audio(
    tiny_engine, torch_decode_engine
):
    # Streams of different lengths join one after the other (prefill steps on torch, decode
    # steps fused on one engine, all on torch on the other): the same audio, to float32
    # rounding, and both caches intact.
    assert tiny_engine.model.backbone.fused_decode is not None
    assert torch_decode_engine.model.backbone.fused_decode is None
    requests = [
        SynthesisRequest(f"f{i}", "z" * (15 + 11 * i), sampling=SamplingParams(seed=i))
        for i in range(3)
    ]
    fused, torch_path = _run(tiny_engine, *requests), _run(torch_decode_engine, *requests)
    for request_id, pieces in fused.items():
        ours = np.concatenate([p.audio for p in pieces])
        theirs = np.concatenate([p.audio for p in torch_path[request_id]])
        assert len(ours) == len(theirs) > 0
        np.testing.assert_allclose(ours, theirs, atol=1e-4)
    tiny_engine.check_integrity()
    torch_decode_engine.check_integrity()
    # What the edge's admission is told: fused decode steps cost each stream its own context.
    assert tiny_engine.info.decodes_padded is False
    assert torch_decode_engine.info.decodes_padded is True


def test_a_step_after_a_rest_says_how_long_the_engine_rested(tiny_engine, monkeypatch):
    tiny_engine.add_request(SynthesisRequest("rest", "x" * 30, sampling=SamplingParams(seed=3)))
    for _ in range(3):
        tiny_engine.step()
    assert tiny_engine.telemetry.last_step.rested_s == 0.0  # back to back
    assert tiny_engine.policy is not None
    monkeypatch.setattr(tiny_engine.policy, "idle_s", lambda running: 0.5)
    assert tiny_engine.idle_s() == 0.5  # the loop would wait...
    time.sleep(0.02)
    monkeypatch.undo()
    tiny_engine.step()  # ...and steps once a stream needs it
    assert tiny_engine.telemetry.last_step.rested_s >= 0.02
    tiny_engine.step()
    assert tiny_engine.telemetry.last_step.rested_s == 0.0
    assert tiny_engine.abort_request("rest")
    while tiny_engine.has_unfinished_requests():
        tiny_engine.step()  # the cancellation's output too
    tiny_engine.check_integrity()
