"""The edge's one JSON policy: what :func:`parse_json` refuses (nesting past MAX_DEPTH, integers
past MAX_INT_DIGITS, numbers that overflow, NaN and Infinity, lone surrogates, bytes that are
not UTF-8, JSON that is not JSON), that every refusal is a :class:`JsonRejected` with a message
a client can read, and that :func:`dump_json` writes only standard JSON."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from cadenza.edge.streams.untrusted_json import (
    MAX_DEPTH,
    MAX_INT_DIGITS,
    JsonRejected,
    dump_json,
    parse_json,
)

LARGEST_INT = 10**MAX_INT_DIGITS - 1


def nested_arrays(depth: int) -> str:
    return "[" * depth + "]" * depth


def nested_objects(depth: int) -> str:
    return '{"a":' * (depth - 1) + "{}" + "}" * (depth - 1)


def depth_of(value: Any) -> int:
    if isinstance(value, list):
        return 1 + max((depth_of(item) for item in value), default=0)
    if isinstance(value, dict):
        return 1 + max((depth_of(item) for item in value.values()), default=0)
    return 0


def refusal(data: str | bytes) -> str:
    with pytest.raises(JsonRejected) as caught:
        parse_json(data)
    message = str(caught.value)
    assert message and message.isprintable()
    return message


json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-LARGEST_INT, max_value=LARGEST_INT)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20)
)
json_values = st.recursive(
    json_scalars,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=24,
)


# -- nesting ----------------------------------------------------------------------------------


@pytest.mark.parametrize("nest", [nested_arrays, nested_objects])
def test_nesting_up_to_max_depth_is_accepted(nest) -> None:
    assert depth_of(parse_json(nest(MAX_DEPTH))) == MAX_DEPTH


@pytest.mark.parametrize("nest", [nested_arrays, nested_objects])
@pytest.mark.parametrize("depth", [MAX_DEPTH + 1, 10_000])
def test_nesting_past_max_depth_is_refused_with_the_depth_in_the_message(nest, depth) -> None:
    message = refusal(nest(depth))
    assert f"nested {depth} levels deep" in message
    assert str(MAX_DEPTH) in message


def test_mixed_arrays_and_objects_count_towards_the_same_depth() -> None:
    text = '[{"a":' * 17 + "1" + "}]" * 17  # 34 levels
    assert "nested 34 levels" in refusal(text)


def test_brackets_inside_strings_do_not_count_as_nesting() -> None:
    text = '["' + "[{" * 500 + '", "\\"' + "[" * 100 + '"]'
    assert parse_json(text) == ["[{" * 500, '"' + "[" * 100]


def test_the_depth_check_runs_before_the_decoder_sees_unbalanced_input() -> None:
    assert "nested" in refusal("[" * 100_000)


# -- numbers ----------------------------------------------------------------------------------


@pytest.mark.parametrize("sign", ["", "-"])
def test_integers_of_max_int_digits_are_accepted(sign: str) -> None:
    assert parse_json(sign + "9" * MAX_INT_DIGITS) == int(sign + "9" * MAX_INT_DIGITS)


@pytest.mark.parametrize("digits", [MAX_INT_DIGITS + 1, 5000, 100_000])
@pytest.mark.parametrize("sign", ["", "-"])
def test_longer_integers_are_refused(sign: str, digits: int) -> None:
    assert f"more than {MAX_INT_DIGITS} digits" in refusal(sign + "7" * digits)


def test_a_long_integer_inside_a_structure_is_refused() -> None:
    refusal('{"seed": [1, 2, ' + "1" * 40 + "]}")


@pytest.mark.parametrize("literal", ["1e999", "-1e999", "1" * 400 + ".0", "2.5E+400"])
def test_numbers_that_overflow_to_infinity_are_refused(literal: str) -> None:
    assert "out of range" in refusal(literal)


def test_long_float_literals_that_stay_finite_are_accepted() -> None:
    assert parse_json("1." + "0" * 5000) == 1.0
    assert parse_json("1e-999") == 0.0


@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity"])
def test_nan_and_infinities_are_refused_anywhere(constant: str) -> None:
    assert "not a JSON number" in refusal(constant)
    refusal(f'{{"data": [1, {constant}]}}')


# -- text -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        '"\\ud800"',
        '"\\udfff"',
        '"ok \\ude00 then"',
        '["fine", {"deep": ["\\ud83d"]}]',
        '{"\\udc00": 1}',
        '{"outer": {"\\ud800x": true}}',
        '"\ud800"',  # a raw lone surrogate in a str, not an escape
    ],
)
def test_lone_surrogates_in_values_and_keys_are_refused(text: str) -> None:
    assert "lone surrogate" in refusal(text)


def test_escaped_surrogate_pairs_are_accepted() -> None:
    assert parse_json('{"\\ud83d\\ude00": "\\ud83d\\ude00"}') == {"😀": "😀"}


@pytest.mark.parametrize(
    ("data", "offset"),
    [(b"\xff", 0), (b'{"a": "\xc3"}', 7), (b'"caf\xe9"', 4), (b'"\xed\xa0\x80"', 1)],
)
def test_bytes_that_are_not_utf8_are_refused_with_the_offset(data: bytes, offset: int) -> None:
    assert f"not UTF-8 at byte {offset}" in refusal(data)


def test_utf8_bytes_and_bytearrays_are_decoded() -> None:
    assert parse_json('{"word": "grüße"}'.encode()) == {"word": "grüße"}
    assert parse_json(bytearray(b"[1, 2]")) == [1, 2]  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "text",
    [
        "",
        "   ",
        "[",
        '{"a": ',
        '{"a": [1, 2',
        '"unterminated',
        "tru",
        "{'a': 1}",
        "[1,]",
        "\ufeff{}",
    ],
)
def test_truncated_or_malformed_json_is_refused(text: str) -> None:
    assert refusal(text).startswith("not valid JSON")


def test_refusals_are_value_errors() -> None:
    assert issubclass(JsonRejected, ValueError)


# -- writing ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value", [float("nan"), float("inf"), -float("inf"), {"a": [float("nan")]}]
)
def test_dump_json_refuses_non_finite_floats(value: Any) -> None:
    with pytest.raises(ValueError, match="JSON compliant"):
        dump_json(value)


def test_dump_json_writes_ascii() -> None:
    text = dump_json({"word": "grüße 😀"})
    assert text.isascii()
    assert json.loads(text) == {"word": "grüße 😀"}


# -- properties -------------------------------------------------------------------------------


@settings(max_examples=150, deadline=None)
@given(json_values)
def test_any_value_within_the_limits_round_trips(value: Any) -> None:
    assume(depth_of(value) <= MAX_DEPTH)
    text = dump_json(value)
    assert parse_json(text) == value
    assert parse_json(text.encode()) == value


json_alphabet = st.sampled_from([*'[]{}",:\\ 0123456789eE.-+truefalsnNIy', "\ud800"])


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=json_alphabet, max_size=60) | st.text(max_size=60))
def test_arbitrary_text_either_parses_or_is_rejected(text: str) -> None:
    try:
        parse_json(text)
    except JsonRejected as exc:
        assert str(exc)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=60))
def test_arbitrary_bytes_either_parse_or_are_rejected(data: bytes) -> None:
    try:
        value = parse_json(data)
    except JsonRejected as exc:
        assert str(exc)
    else:
        dump_json(value)  # whatever is accepted can be written back
