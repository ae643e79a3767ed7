"""Where streamed text is cut: each rule of :mod:`cadenza.edge.streams.text_segmenter`, then
garbage and fuzz (every character arrives in exactly one segment, in order)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from cadenza.config import TextStreamConfig
from cadenza.edge.streams.text_segmenter import TextSegmenter


def segmenter(**config: float) -> TextSegmenter:
    return TextSegmenter(TextStreamConfig(**config))


def feed(s: TextSegmenter, text: str, now: float = 0.0) -> list[str]:
    """``text`` word by word; the segments cut as it arrives."""
    cut = []
    for word in text.split(" "):
        s.append(word + " ", now)
        while (segment := s.next_segment(now)) is not None:
            cut.append(segment)
    return cut


def test_a_sentence_is_a_segment_as_soon_as_its_end_arrives():
    s = segmenter()
    s.append("Hello there", 0.0)
    assert s.next_segment(0.0) is None
    s.append("!", 0.0)
    assert s.next_segment(0.0) == "Hello there!"
    s.append("It costs 3.", 0.0)
    assert s.next_segment(0.0) is None  # "3.14" may still come
    s.append("14 now. How", 0.0)
    assert s.next_segment(0.0) == "It costs 3.14 now."
    assert s.pending == "How"


def test_abbreviations_initials_and_decimals_do_not_end_sentences():
    assert feed(segmenter(), "Dr. Smith met J. Doe e.g. at 3.14 pm. Then left") == [
        "Dr. Smith met J. Doe e.g. at 3.14 pm."
    ]


def test_question_exclamation_ellipsis_quotes_and_new_lines_end_sentences():
    s = segmenter()
    assert feed(s, 'Really?! "Yes." Wait… ok\nnext') == ["Really?!", '"Yes."', "Wait…", "ok"]


def test_complete_sentences_that_waited_go_together_up_to_the_length_limit():
    s = segmenter(segment_max_chars=40)
    s.append("One two. Three four. Five six seven eight nine. Ten", 0.0)
    assert s.next_segment(0.0) == "One two. Three four."
    assert s.next_segment(0.0) == "Five six seven eight nine."
    assert s.next_segment(0.0) is None


def test_a_clause_ends_a_segment_once_it_is_long_enough():
    s = segmenter(clause_min_chars=20)
    assert feed(s, "Short, then a much longer clause, and more") == [
        "Short, then a much longer clause,"
    ]


def test_the_length_limit_cuts_at_the_last_space_or_at_the_limit():
    s = segmenter(segment_max_chars=20)
    s.append("aaaa bbbb cccc dddd eeee", 0.0)
    assert s.next_segment(0.0) == "aaaa bbbb cccc dddd"
    s = segmenter(segment_max_chars=20)
    s.append("x" * 45, 0.0)
    assert [s.next_segment(0.0), s.next_segment(0.0)] == ["x" * 20, "x" * 20]


def test_the_wait_limit_speaks_text_without_a_boundary_up_to_its_last_space():
    s = segmenter(segment_wait_ms=500)
    s.append("an unfinished thou", 10.0)
    assert s.next_segment(10.4) is None and s.ready_at() == 10.5
    assert s.next_segment(10.5) == "an unfinished"
    assert s.pending == "thou" and s.ready_at() == 11.0


def test_flush_speaks_what_had_arrived_and_no_more():
    s = segmenter()
    s.append("no boundary here", 0.0)
    s.flush()
    s.append(" and later", 0.0)
    assert s.next_segment(0.0) == "no boundary here"
    assert s.next_segment(0.0) is None


def test_the_end_of_the_text_is_the_last_segment_and_whitespace_is_none():
    s = segmenter()
    s.append("last words  ", 0.0)
    s.end()
    assert s.next_segment(0.0) == "last words"
    assert s.exhausted and s.next_segment(0.0) is None
    blank = segmenter()
    blank.append("  \n ", 0.0)
    blank.end()
    assert blank.next_segment(0.0) is None and blank.exhausted


def test_text_after_the_end_is_refused():
    s = segmenter()
    s.end()
    try:
        s.append("more", 0.0)
    except ValueError as exc:
        assert "text_end" in str(exc)
    else:
        raise AssertionError("text after the end was taken")


@settings(max_examples=200, deadline=None)
@given(
    pieces=st.lists(st.text(max_size=30), max_size=30),
    flushes=st.lists(st.booleans(), max_size=30),
    max_chars=st.integers(20, 80),
)
def test_every_word_arrives_in_exactly_one_segment_in_order(pieces, flushes, max_chars):
    s = segmenter(segment_max_chars=max_chars, clause_min_chars=10)
    segments = []
    for index, piece in enumerate(pieces):
        s.append(piece, float(index))
        if index < len(flushes) and flushes[index]:
            s.flush()
        while (segment := s.next_segment(index + 0.3)) is not None:
            segments.append(segment)
    s.end()
    while (segment := s.next_segment(99.0)) is not None:
        segments.append(segment)
    assert s.exhausted
    assert all(segment.strip() == segment and segment for segment in segments)
    assert all(len(segment) <= max_chars for segment in segments)
    assert "".join("".join(segments).split()) == "".join("".join(pieces).split())


def test_one_sentence_mode_never_groups_sentences():
    s = TextSegmenter(TextStreamConfig(), one_sentence=True)
    s.append("First one. Second one! Dr. Who came at 3.14 today? And the rest", 0.0)
    s.end()
    segments = []
    while (segment := s.next_segment(0.0)) is not None:
        segments.append(segment)
    assert segments == [
        "First one.",
        "Second one!",
        "Dr. Who came at 3.14 today?",
        "And the rest",
    ]
