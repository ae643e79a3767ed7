"""Per-request sampling settings."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any


@dataclass(frozen=True)
class SamplingParams:
    """How a request's tokens are drawn.

    ``temperature == 0`` is greedy. ``top_k == 0``, ``top_p == 1`` and ``min_p == 0`` disable
    those filters; ``min_p`` keeps the ids at least that fraction as likely as the best one.
    ``stop_ids`` end the sequence when sampled, as the model's own EOS ids do (for a speech
    model, at a frame boundary, among the ids its layout lets it sample there).
    ``repetition_penalty`` > 1 discourages ids a codebook has already seen (prompt included),
    as Hugging Face applies it: positive logits divided, negative ones multiplied.
    ``fine_temperature``: the temperature of a model's last stage where it has one of its own
    (Bark's fine stage; ``None``: the model's default, 0: greedy); models without one refuse
    it. ``seed
    makes a request reproducible on its own, whatever else is in the batch; ``None`` draws a
    fresh seed.
    """

    temperature: float = 1.0
    top_k: int = 250
    top_p: float = 1.0
    seed: int | None = None
    repetition_penalty: float = 1.0
    min_p: float = 0.0
    stop_ids: tuple[int, ...] = ()
    fine_temperature: float | None = None

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError("temperature must be >= 0")
        if self.fine_temperature is not None and self.fine_temperature < 0:
            raise ValueError("fine_temperature must be >= 0")
        if self.top_k < 0:
            raise ValueError("top_k must be >= 0")
        if not 0 < self.top_p <= 1:
            raise ValueError("top_p must be in (0, 1]")
        if self.repetition_penalty <= 0:
            raise ValueError("repetition_penalty must be > 0")
        if not 0 <= self.min_p < 1:
            raise ValueError("min_p must be in [0, 1)")
        if any(token < 0 for token in self.stop_ids):
            raise ValueError("stop_ids must be non-negative token ids")

    def with_overrides(self, **values: float | int | tuple[int, ...] | None) -> SamplingParams:
        """These settings with every given (non-``None``) value replaced: a model's defaults
        under a request's own choices. Raises ``ValueError`` for an invalid value."""
        given: dict[str, Any] = {k: v for k, v in values.items() if v is not None}
        return replace(self, **given)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0
