"""Resume tokens are unguessable and match the pattern a ``resume`` message is checked with."""

from __future__ import annotations

import re

from cadenza.edge.streams.resume_token import TOKEN_PATTERN, new_token


def test_tokens_match_the_pattern_and_do_not_repeat() -> None:
    tokens = {new_token() for _ in range(1000)}
    assert len(tokens) == 1000
    assert all(re.fullmatch(TOKEN_PATTERN, token) and len(token) == 32 for token in tokens)
