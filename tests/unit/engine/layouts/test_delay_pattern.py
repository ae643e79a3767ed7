from hypothesis import given
from hypothesis import strategies as st

from cadenza.engine.layouts.delay_pattern import DelayPattern

PAD = 99
START = 98


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


def test_a_prompts_rows_and_the_lead_in_follow_the_diagram():
    pattern = DelayPattern(num_codebooks=3, pad_id=PAD, start_id=START)
    prompt = [[10, 11, 12], [20, 21, 22]]  # p0, p1
    assert pattern.rows_over(prompt) == [[10, START, START], [20, 11, START]]
    assert pattern.forced_ids(0, None, prompt) == [None, 21, 12]
    assert pattern.forced_ids(1, None, prompt) == [None, None, 22]
    assert pattern.forced_ids(2, None, prompt) == [None, None, None]
    # a prompt shorter than the delays: the start id before its first frame
    assert pattern.forced_ids(0, None, prompt[1:]) == [None, 21, START]


@given(
    st.lists(st.integers(0, 12), min_size=1, max_size=6),
    st.integers(0, 20),
    st.integers(1, 20),
)
def test_a_prompt_and_its_continuation_spell_every_frame_in_order(delays, prompt_len, new_len):
    """The prompt's rows, then the stream's steps with the prompt as its lead-in, are the
    pattern's rows over the prompt's frames followed by the new ones."""
    pattern = DelayPattern(len(delays), PAD, delays=tuple(delays), start_id=START)
    width = len(delays)
    frames = [[frame * 100 + k for k in range(width)] for frame in range(prompt_len + new_len)]
    prompt, new = frames[:prompt_len], frames[prompt_len:]
    rows = pattern.rows_over(prompt)
    for step in range(pattern.steps_needed(new_len)):
        forced = pattern.forced_ids(step, new_len, prompt)
        rows.append(
            [
                forced[k] if forced[k] is not None else new[step - delay][k]
                for k, delay in enumerate(delays)
            ]
        )
    whole = pattern.rows_over(frames)
    assert rows[: len(whole)] == whole
    assert [pattern.frame_codes(rows, f) for f in range(len(frames))] == frames
