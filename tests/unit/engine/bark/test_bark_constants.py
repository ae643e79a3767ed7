"""Bark's constants from ``generation_config.json``: published values by default, a
checkpoint's own where it gives them, garbage named."""

from __future__ import annotations

import pytest

from cadenza.engine.models.bark.bark_constants import BarkConstants, bark_constants


def test_published_values_and_what_follows_from_them() -> None:
    constants = bark_constants(None)
    assert constants == BarkConstants()
    assert constants.semantic_to_coarse_ratio == pytest.approx(75 / 49.9 * 2)
    assert constants.max_semantic_history == 209
    assert constants.semantic_end_token == 10_000


def test_a_checkpoint_overrides_what_it_gives() -> None:
    constants = bark_constants(
        {
            "semantic_config": {"max_new_tokens": 500, "eos_token_id": 10_000, "other": 1},
            "coarse_acoustics_config": {"sliding_window_len": 40, "coarse_rate_hz": 75},
            "codebook_size": 1024,
        }
    )
    assert constants.max_new_semantic_tokens == 500 and constants.sliding_window_len == 40
    assert isinstance(constants.coarse_rate_hz, float)


@pytest.mark.parametrize("value", ["60", True, None, [60]])
def test_garbage_is_named(value: object) -> None:
    config = {"coarse_acoustics_config": {"sliding_window_len": value}}
    if value is None:  # a null keeps the published value
        assert bark_constants(config).sliding_window_len == 60
        return
    with pytest.raises(ValueError, match=r"coarse_acoustics_config\.sliding_window_len"):
        bark_constants(config)
