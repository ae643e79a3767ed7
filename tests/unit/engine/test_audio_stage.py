"""Audio stage with the real codec: chunk outputs, endings, failures freeing slots, slot reuse."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from cadenza.codecs.codec import CodecError
from cadenza.contract.request import FinishReason
from cadenza.contract.sampling import SamplingParams
from cadenza.engine.audio_stage import AudioStage, TokenOutputs
from cadenza.engine.layouts.delay_pattern import DelayPatternLayout
from cadenza.engine.realtime.playout_clock import PlayoutClock
from cadenza.engine.realtime.step_telemetry import StepTelemetry
from cadenza.engine.scheduler import StepOutcome
from cadenza.engine.sequence import AudioProgress, Sequence

FIRST, CHUNK = 8, 6
ARRIVAL = 100.0


class FakeClock:
    def __init__(self, now: float = ARRIVAL + 0.1) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def parts(tiny_engine):
    """The tiny engine's codec and layout (the engine itself is left alone)."""
    yield tiny_engine.audio.codec, tiny_engine.layout
    tiny_engine.check_integrity()
    assert not tiny_engine.has_unfinished_requests()


def make_stage(parts, max_streams: int = 4, clock: FakeClock | None = None) -> AudioStage:
    codec, layout = parts
    return AudioStage(
        codec,
        layout,
        max_streams=max_streams,
        first_chunk_frames=FIRST,
        chunk_frames=CHUNK,
        telemetry=StepTelemetry(None),
        clock=clock or FakeClock(),
    )


def code(frame: int, codebook: int) -> int:
    return (frame * 37 + codebook * 101) % 1024


def make_stream(layout: DelayPatternLayout, name: str, target_frames: int) -> Sequence:
    pad = layout.pattern.pad_id
    seq = Sequence(
        name,
        [[pad] * layout.num_codebooks],
        SamplingParams(),
        torch.Generator(),
        max_new_steps=target_frames + layout.tail_steps,
    )
    seq.target_frames = target_frames
    seq.audio = AudioProgress(PlayoutClock(ARRIVAL, 0.3, 1 / 75, 0.1))
    return seq


def advance(layout: DelayPatternLayout, seq: Sequence, eos: bool = False) -> FinishReason | None:
    """Append the next row as the scheduler would (codes from :func:`code`, pads where the
    delay pattern forces them, EOS on codebook 0 if ``eos``); returns the finish reason."""
    step = seq.num_generated
    forced = layout.pattern.forced_ids(step, seq.end_frame)
    row = [code(step - k, k) if f is None else f for k, f in enumerate(forced)]
    if eos:
        row[0] = layout.eos_id
    seq.append(row)
    seq.end_frame, reason = layout.on_row(seq, row)
    return reason


def expected_codes(layout: DelayPatternLayout, start: int, end: int) -> np.ndarray:
    frames = [[code(f, k) for k in range(layout.num_codebooks)] for f in range(start, end)]
    return np.array(frames, dtype=np.uint16).reshape(-1, layout.num_codebooks)


def run_to_end(stage: AudioStage, layout, seq: Sequence) -> list:
    """Step ``seq`` to its end, emitting after every step; the outputs with their step."""
    outputs = []
    while True:
        reason = advance(layout, seq)
        outcome = StepOutcome(sampled=[seq], finished={seq: reason} if reason else {})
        outputs += [(seq.num_generated, out) for out in stage.emit(outcome)]
        if reason:
            return outputs


def test_a_stream_gets_a_small_first_chunk_then_full_chunks_then_its_last_audio(parts) -> None:
    codec, layout = parts
    stage = make_stage(parts)
    seq = make_stream(layout, "s", target_frames=22)
    stage.open(seq)
    outputs = run_to_end(stage, layout, seq)
    hop = codec.hop_length
    tail = layout.tail_steps  # frame f is complete after step f + tail
    assert [(step, len(out.audio) // hop) for step, out in outputs] == [
        (FIRST + tail, FIRST),  # frames 0-7, as soon as they are complete
        (FIRST + CHUNK + tail, CHUNK),
        (FIRST + 2 * CHUNK + tail, CHUNK),
        (22 + tail, 2),  # the last frames, with the ending
    ]
    assert all(len(out.audio) % hop == 0 for _, out in outputs)
    assert [out.finish_reason for _, out in outputs] == [None, None, None, FinishReason.LENGTH]
    last = outputs[-1][1]
    assert last.error is None and last.error_code is None
    assert seq.audio.frames_sent == 22 and seq.audio.codec_slot is None
    assert stage.decoder.open_slots == frozenset()

    starts = [0, 8, 14, 20, 22]
    for (_, out), start, end in zip(outputs, starts, starts[1:], strict=False):
        assert out.codes.dtype == np.uint16
        assert np.array_equal(out.codes, expected_codes(layout, start, end))
    audio = np.concatenate([out.audio for _, out in outputs])
    assert audio.dtype == np.float32 and np.abs(audio).max() <= 1.0
    all_codes = torch.tensor(expected_codes(layout, 0, 22).T, dtype=torch.long)[None]
    offline = codec.decode(all_codes)[0].clamp(-1.0, 1.0).numpy()
    assert offline.shape == audio.shape
    assert np.abs(audio - offline).max() <= 1e-4 * max(np.abs(offline).max(), 1e-6)


def test_a_first_chunk_shorter_than_the_codec_context_does_not_start_the_clock(parts) -> None:
    codec, layout = parts
    stage = make_stage(parts)
    stage.first_chunk_frames = 4  # below EnCodec's 7 frames of context: decodes to nothing yet
    seq = make_stream(layout, "short-first", target_frames=22)
    stage.open(seq)
    outputs = run_to_end(stage, layout, seq)
    total = sum(len(out.audio) for _, out in outputs)
    assert total == 22 * codec.hop_length  # no audio is lost
    assert len(outputs[0][1].audio) == 0
    audible = sum(1 for _, out in outputs if len(out.audio))
    assert len(stage.telemetry.take_report().chunk_slack_s) == audible


def test_a_stream_that_ends_at_once_gets_an_empty_ending_and_frees_its_slot(parts) -> None:
    _, layout = parts
    stage = make_stage(parts)
    seq = make_stream(layout, "eos", target_frames=20)
    stage.open(seq)
    reason = advance(layout, seq, eos=True)  # EOS at step 0: no frames at all
    assert reason is FinishReason.EOS and seq.end_frame == 0
    (out,) = stage.emit(StepOutcome(sampled=[seq], finished={seq: reason}))
    assert out.finish_reason is FinishReason.EOS and len(out.audio) == 0
    assert seq.audio.codec_slot is None and stage.decoder.open_slots == frozenset()
    assert stage.telemetry.take_report().chunk_slack_s == ()  # an empty chunk is no delivery


def test_a_failed_stream_releases_its_slot_unheard_with_an_internal_error(parts) -> None:
    _, layout = parts
    stage = make_stage(parts, max_streams=1)
    seq = make_stream(layout, "bad", target_frames=20)
    stage.open(seq)
    slot = seq.audio.codec_slot
    for _ in range(FIRST + layout.tail_steps - 1):  # frames pending, not yet due
        advance(layout, seq)
        assert stage.emit(StepOutcome(sampled=[seq])) == []
    seq.error = "RuntimeError: model exploded"  # what Scheduler.finish records
    (out,) = stage.emit(StepOutcome(failed={seq: seq.error}))
    assert out.request_id == "bad" and out.finish_reason is FinishReason.ERROR
    assert out.error == "RuntimeError: model exploded" and out.error_code == "internal"
    assert len(out.audio) == 0 and out.codes is None
    assert seq.audio.codec_slot is None
    assert stage.decoder.open_slots == frozenset()
    other = make_stream(layout, "next", target_frames=20)
    stage.open(other)  # the only slot is free again
    assert other.audio.codec_slot == slot


def test_a_failure_does_not_disturb_the_other_streams_of_the_step(parts) -> None:
    _, layout = parts
    stage = make_stage(parts)
    good, bad = make_stream(layout, "good", 20), make_stream(layout, "bad", 20)
    stage.open(good)
    stage.open(bad)
    for _ in range(FIRST + layout.tail_steps):
        advance(layout, good)
        advance(layout, bad)
    bad.error = "boom"
    outputs = stage.emit(StepOutcome(sampled=[good], failed={bad: "boom"}))
    assert [(o.request_id, o.finish_reason, len(o.audio) > 0) for o in outputs] == [
        ("bad", FinishReason.ERROR, False),
        ("good", None, True),
    ]
    assert stage.decoder.open_slots == {good.audio.codec_slot}


def test_slots_are_limited_and_reused_after_release(parts) -> None:
    _, layout = parts
    stage = make_stage(parts, max_streams=2)
    a, b, c = (make_stream(layout, name, 20) for name in "abc")
    stage.open(a)
    stage.open(b)
    assert {a.audio.codec_slot, b.audio.codec_slot} == {0, 1}
    with pytest.raises(CodecError):
        stage.open(c)
    freed = a.audio.codec_slot
    stage.release(a)
    assert a.audio.codec_slot is None
    stage.release(a)  # releasing twice is harmless
    stage.open(c)
    assert c.audio.codec_slot == freed
    stage.release(b)
    stage.release(c)
    assert stage.decoder.open_slots == frozenset()


def test_streams_that_join_decode_in_the_same_codec_call(parts) -> None:
    _, layout = parts
    stage = make_stage(parts)
    calls = []
    decode = stage.decoder.decode

    def spy(chunks, final=frozenset()):
        calls.append({slot: int(c.shape[1]) for slot, c in chunks.items()})
        return decode(chunks, final)

    stage.decoder.decode = spy
    leader, joiner = make_stream(layout, "leader", 40), make_stream(layout, "joiner", 40)
    stage.open(leader)
    stage.open(joiner)
    for _ in range(FIRST + layout.tail_steps):  # both reach their first chunk together
        advance(layout, leader)
        advance(layout, joiner)
    stage.emit(StepOutcome(sampled=[leader, joiner]))
    assert calls == [{leader.audio.codec_slot: FIRST, joiner.audio.codec_slot: FIRST}]
    for _ in range(CHUNK):
        advance(layout, leader)
    for _ in range(CHUNK // 3):  # the joiner is only a third of the way
        advance(layout, joiner)
    outputs = stage.emit(StepOutcome(sampled=[leader, joiner]))
    assert calls[-1] == {leader.audio.codec_slot: CHUNK, joiner.audio.codec_slot: CHUNK // 3}
    assert [o.request_id for o in outputs] == ["leader", "joiner"]
    assert joiner.audio.frames_sent == FIRST + CHUNK // 3
    stage.release(leader)
    stage.release(joiner)


def test_the_telemetry_gets_each_chunks_slack_and_the_codecs_frames(parts) -> None:
    _, layout = parts
    clock = FakeClock(ARRIVAL + 0.1)
    stage = make_stage(parts, clock=clock)
    seq = make_stream(layout, "s", 20)
    stage.open(seq)
    for _ in range(FIRST + layout.tail_steps):
        advance(layout, seq)
    stage.emit(StepOutcome(sampled=[seq]))
    report = stage.telemetry.take_report()
    assert report.chunk_slack_s == pytest.approx((0.2,))  # due 300 ms after arrival
    assert report.codec_frames == FIRST and report.codec_s >= 0.0
    # The first delivery starts playout one reserve later; the next chunk is due against it.
    assert seq.audio.playout.playout_start_s == pytest.approx(ARRIVAL + 0.2)
    clock.now = ARRIVAL + 0.25
    for _ in range(CHUNK):
        advance(layout, seq)
    stage.emit(StepOutcome(sampled=[seq]))
    (slack,) = stage.telemetry.take_report().chunk_slack_s
    assert slack == pytest.approx(ARRIVAL + 0.2 + FIRST / 75 - clock.now)
    stage.release(seq)


def test_a_codec_whose_codebooks_differ_from_the_layout_is_refused(parts) -> None:
    codec, _ = parts
    other = DelayPatternLayout(num_codebooks=4, codebook_size=1024, pad_id=1024, eos_id=1025)
    with pytest.raises(ValueError, match="codebooks"):
        AudioStage(
            codec,
            other,
            max_streams=1,
            first_chunk_frames=FIRST,
            chunk_frames=CHUNK,
            telemetry=StepTelemetry(None),
        )


def test_token_outputs_report_only_endings() -> None:
    stage = TokenOutputs()
    done = Sequence("done", [[1]], SamplingParams(), torch.Generator(), 4)
    failed = Sequence("failed", [[1]], SamplingParams(), torch.Generator(), 4)
    running = Sequence("running", [[1]], SamplingParams(), torch.Generator(), 4)
    failed.error = "RuntimeError: boom"
    stage.open(done)
    outputs = stage.emit(
        StepOutcome(
            sampled=[done, running],
            finished={done: FinishReason.EOS},
            failed={failed: failed.error},
        )
    )
    assert [(o.request_id, o.finish_reason, o.error, o.error_code) for o in outputs] == [
        ("failed", FinishReason.ERROR, "RuntimeError: boom", "internal"),
        ("done", FinishReason.EOS, None, None),
    ]
    assert all(len(o.audio) == 0 for o in outputs)
    stage.release(done)
