"""Bark's special ids, offsets and window sizes, as its ``generation_config.json`` gives them
(the ``semantic_config``, ``coarse_acoustics_config`` and ``fine_acoustics_config`` sections;
a key a checkpoint leaves out keeps the published value)."""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace
from typing import Any


@dataclass(frozen=True)
class BarkConstants:
    """Everything the three stages' windowing needs besides the weights."""

    # Semantic stage: text ids are shifted past the semantic vocabulary; padding, the infer
    # token and the end of the semantic tokens have ids of their own.
    text_encoding_offset: int = 10_048
    text_pad_token: int = 129_595
    semantic_infer_token: int = 129_599
    semantic_vocab_size: int = 10_000
    semantic_pad_token: int = 10_000  # also the semantic stage's end token
    max_input_semantic_length: int = 256
    semantic_rate_hz: float = 49.9
    max_new_semantic_tokens: int = 768
    # Coarse stage: EnCodec's first two codebooks, interleaved, shifted past the semantic ids.
    coarse_semantic_pad_token: int = 12_048
    coarse_infer_token: int = 12_050
    coarse_rate_hz: float = 75.0
    n_coarse_codebooks: int = 2
    max_coarse_input_length: int = 256
    max_coarse_history: int = 630
    sliding_window_len: int = 60
    # Fine stage: non-causal windows over all eight codebooks.
    max_fine_history_length: int = 512
    max_fine_input_length: int = 1024
    n_fine_codebooks: int = 8
    codebook_size: int = 1024

    @property
    def semantic_to_coarse_ratio(self) -> float:
        """Coarse tokens (both codebooks counted) per semantic token."""
        return self.coarse_rate_hz / self.semantic_rate_hz * self.n_coarse_codebooks

    @property
    def max_semantic_history(self) -> int:
        """Semantic tokens a coarse window looks back at."""
        return math.floor(self.max_coarse_history / self.semantic_to_coarse_ratio)

    @property
    def semantic_end_token(self) -> int:
        return self.semantic_pad_token


_KEYS = {
    "semantic_config": {
        "text_encoding_offset": "text_encoding_offset",
        "text_pad_token": "text_pad_token",
        "semantic_infer_token": "semantic_infer_token",
        "semantic_vocab_size": "semantic_vocab_size",
        "eos_token_id": "semantic_pad_token",
        "max_input_semantic_length": "max_input_semantic_length",
        "semantic_rate_hz": "semantic_rate_hz",
        "max_new_tokens": "max_new_semantic_tokens",
    },
    "coarse_acoustics_config": {
        "coarse_semantic_pad_token": "coarse_semantic_pad_token",
        "coarse_infer_token": "coarse_infer_token",
        "coarse_rate_hz": "coarse_rate_hz",
        "n_coarse_codebooks": "n_coarse_codebooks",
        "max_coarse_input_length": "max_coarse_input_length",
        "max_coarse_history": "max_coarse_history",
        "sliding_window_len": "sliding_window_len",
    },
    "fine_acoustics_config": {
        "max_fine_history_length": "max_fine_history_length",
        "max_fine_input_length": "max_fine_input_length",
        "n_fine_codebooks": "n_fine_codebooks",
    },
}


def bark_constants(generation_config: dict[str, Any] | None) -> BarkConstants:
    """The constants of a checkpoint's ``generation_config.json`` (``None``: the published
    ones). Raises ``ValueError`` naming a value of the wrong type."""
    constants = BarkConstants()
    if not generation_config:
        return constants
    types = {field.name: field.type for field in fields(BarkConstants)}
    changes: dict[str, Any] = {}
    for section, keys in _KEYS.items():
        given = generation_config.get(section) or {}
        for key, name in keys.items():
            if key not in given or given[key] is None:
                continue
            value = given[key]
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ValueError(
                    f"generation_config.json {section}.{key}: {value!r} is not a number"
                )
            changes[name] = float(value) if types[name] == "float" else int(value)
    if "codebook_size" in generation_config:
        changes["codebook_size"] = int(generation_config["codebook_size"])
    return replace(constants, **changes)
