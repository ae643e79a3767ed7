import numpy as np

from cadenza.edge.transports.jitter_buffer import FrameKind, JitterBuffer


def _frames(buffer, count):
    return [buffer.pop_frame() for _ in range(count)]


def test_waits_for_the_reserve_then_plays_everything():
    buffer = JitterBuffer(reserve_ms=100)
    assert buffer.pop_frame()[1] is FrameKind.IDLE
    buffer.start()
    buffer.push(np.ones(960 * 3, np.float32))  # 60 ms < reserve
    assert buffer.pop_frame()[1] is FrameKind.WAITING
    buffer.push(np.ones(960 * 3, np.float32))  # 120 ms
    kinds = [kind for _, kind in _frames(buffer, 6)]
    assert kinds == [FrameKind.AUDIO] * 6
    buffer.end()
    assert buffer.pop_frame()[1] is FrameKind.IDLE
    assert buffer.stats.underruns == 0 and buffer.stats.frames_played == 6


def test_underruns_are_counted_once_per_gap_with_the_longest_kept():
    buffer = JitterBuffer(reserve_ms=20)
    buffer.start()
    buffer.push(np.ones(960, np.float32))
    assert buffer.pop_frame()[1] is FrameKind.AUDIO
    assert [k for _, k in _frames(buffer, 3)] == [FrameKind.UNDERRUN] * 3
    buffer.push(np.ones(960, np.float32))
    assert buffer.pop_frame()[1] is FrameKind.AUDIO
    assert buffer.pop_frame()[1] is FrameKind.UNDERRUN
    assert buffer.stats.underruns == 2 and buffer.stats.longest_underrun_ms == 60


def test_short_utterance_plays_without_reaching_the_reserve_and_is_padded():
    buffer = JitterBuffer(reserve_ms=200)
    buffer.start()
    buffer.push(np.full(500, 0.5, np.float32))
    buffer.end()
    frame, kind = buffer.pop_frame()
    assert kind is FrameKind.AUDIO and frame.size == 960
    assert np.allclose(frame[:500], 0.5) and not frame[500:].any()


def test_barge_in_clears_at_once():
    buffer = JitterBuffer(reserve_ms=20)
    buffer.start()
    buffer.push(np.ones(960 * 50, np.float32))
    buffer.pop_frame()
    buffer.clear()
    assert buffer.depth_ms == 0
    frame, kind = buffer.pop_frame()
    assert kind is FrameKind.IDLE and not frame.any()
    buffer.push(np.ones(960, np.float32))  # late audio of the cancelled utterance is dropped
    assert buffer.depth_ms == 0


def test_running_dry_while_held_for_text_is_text_wait_and_refills_the_reserve():
    buffer = JitterBuffer(reserve_ms=40)
    buffer.start()
    buffer.push(np.ones(960 * 2, np.float32))
    assert [k for _, k in _frames(buffer, 2)] == [FrameKind.AUDIO] * 2
    buffer.hold()
    assert [k for _, k in _frames(buffer, 3)] == [FrameKind.WAITING] * 3
    buffer.release()
    buffer.push(np.ones(960, np.float32))  # less than the reserve: it waits for more
    assert buffer.pop_frame()[1] is FrameKind.WAITING
    buffer.push(np.ones(960, np.float32))
    assert [k for _, k in _frames(buffer, 2)] == [FrameKind.AUDIO] * 2
    assert buffer.stats.underruns == 0 and buffer.stats.text_wait_ms == 60


def test_held_with_audio_left_plays_on_and_a_late_segment_is_an_underrun():
    buffer = JitterBuffer(reserve_ms=20)
    buffer.start()
    buffer.push(np.ones(960 * 2, np.float32))
    buffer.hold()
    assert buffer.pop_frame()[1] is FrameKind.AUDIO
    buffer.release()  # the text came in time
    assert buffer.pop_frame()[1] is FrameKind.AUDIO
    assert buffer.pop_frame()[1] is FrameKind.UNDERRUN
    assert buffer.stats.underruns == 1 and buffer.stats.text_wait_ms == 0
