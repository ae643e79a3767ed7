from hypothesis import given
from hypothesis import strategies as st

from cadenza.engine.layouts.delay_pattern import DelayPattern

PAD = 99


def test_forced_ids_follow_the_diagram():
    pattern = DelayPattern(num_codebooks=3, pad_id=PAD)
    assert pattern.forced_ids(0, None) == [None, PAD, PAD]
    assert pattern.forced_ids(2, None) == [None, None, None]
    # 3 frames: step 3 only codebooks 1 and 2 still have frames to emit, step 4 only codebook 2
    assert pattern.forced_ids(3, 3) == [PAD, None, None]
    assert pattern.forced_ids(4, 3) == [PAD, PAD, None]
    assert pattern.steps_needed(3) == 5
    assert pattern.steps_needed(0) == 0


@given(st.integers(1, 8), st.integers(1, 40))
def test_emitting_then_gathering_recovers_frames(num_codebooks, num_frames):
    pattern = DelayPattern(num_codebooks, PAD)
    frames = [[frame * 10 + k for k in range(num_codebooks)] for frame in range(num_frames)]
    rows = []
    for step in range(pattern.steps_needed(num_frames)):
        forced = pattern.forced_ids(step, num_frames)
        rows.append(
            [PAD if forced[k] is not None else frames[step - k][k] for k in range(num_codebooks)]
        )
    assert pattern.frames_complete(len(rows)) == num_frames
    assert [pattern.frame_codes(rows, f) for f in range(num_frames)] == frames
