"""One JSON policy for every surface that reads what clients send (HTTP bodies, WebSocket and
data-channel messages, WebRTC offers) and for every JSON the edge writes back.

Reading (:func:`parse_json`) refuses, with :class:`JsonRejected`, before anything else sees
the value:

* bytes that are not UTF-8, and strings holding lone surrogates (``"\\ud800"``), which would
  break the first encoder they reach;
* nesting deeper than :data:`MAX_DEPTH` (a recursion bomb for any recursive consumer);
* integers of more than :data:`MAX_INT_DIGITS` digits (quadratic to parse, and past Python's
  own limit an exception nobody expects) and numbers that overflow to infinity;
* ``NaN``, ``Infinity`` and ``-Infinity``, which are not JSON.

Writing (:func:`dump_json`) produces standard JSON only (non-finite floats raise), so every
browser's ``JSON.parse`` accepts it.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

MAX_DEPTH = 32
MAX_INT_DIGITS = 32

# A string, or an unterminated one up to the end of the text (so a run of escaped quotes with
# no closing quote is one linear match, not a quadratic series of failed ones).
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"?', re.DOTALL)
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")


class JsonRejected(ValueError):
    """Input that is not acceptable JSON; the message says why (safe to show the client)."""


def parse_json(data: str | bytes) -> Any:
    """Decode untrusted JSON under the policy above. Raises :class:`JsonRejected`."""
    if isinstance(data, bytes | bytearray):
        try:
            text = bytes(data).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise JsonRejected(f"not UTF-8 at byte {exc.start}") from exc
    else:
        text = data
    depth = _max_depth(text)
    if depth > MAX_DEPTH:
        raise JsonRejected(f"nested {depth} levels deep; at most {MAX_DEPTH} are accepted")
    try:
        value = json.loads(
            text,
            parse_int=_parse_int,
            parse_float=_parse_float,
            parse_constant=_refuse_constant,
        )
    except json.JSONDecodeError as exc:
        raise JsonRejected(f"not valid JSON: {exc}") from exc
    except RecursionError as exc:  # the depth check should make this unreachable
        raise JsonRejected("nested too deeply") from exc
    _check_strings(value)
    return value


def dump_json(value: Any) -> str:
    """Standard JSON (ASCII, no NaN or Infinity). Raises ``ValueError`` for non-finite
    floats."""
    return json.dumps(value, allow_nan=False)


def _max_depth(text: str) -> int:
    """Deepest bracket nesting outside strings (a linear scan, before any recursion)."""
    brackets = _NOT_BRACKET.sub("", _STRING.sub("", text))
    depth = deepest = 0
    for char in brackets:
        if char in "[{":
            depth += 1
            deepest = max(deepest, depth)
        else:
            depth -= 1
    return deepest


def _parse_int(literal: str) -> int:
    if len(literal.lstrip("-")) > MAX_INT_DIGITS:
        raise JsonRejected(f"an integer of more than {MAX_INT_DIGITS} digits")
    return int(literal)


def _parse_float(literal: str) -> float:
    value = float(literal)
    if not math.isfinite(value):
        raise JsonRejected(f"number {literal[:20]!r} is out of range")
    return value


def _refuse_constant(name: str) -> Any:
    raise JsonRejected(f"{name} is not a JSON number")


def _check_strings(value: Any) -> None:
    """Every string and key must encode as UTF-8 (no lone surrogates)."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise JsonRejected("a string holds a lone surrogate (not valid Unicode)") from exc
    elif isinstance(value, dict):
        for key, item in value.items():
            _check_strings(key)
            _check_strings(item)
    elif isinstance(value, list):
        for item in value:
            _check_strings(item)
