"""Per-request sampling settings, and the model-specific ones a model declares.

Every model honours the common fields. The others (:data:`MODEL_SAMPLING_FIELDS`) mean
something only to models that have the part they steer (a separate fine stage, a guided
decoder); a model declares the ones it takes and :func:`check_model_fields` refuses the rest,
by name, wherever a request enters (the edge before admission, the engine's intake).
"""

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
    (Bark's fine stage; ``None``: the model's default, 0: greedy). ``guidance_scale``: how
    far classifier-free guidance pushes a guided model's logits from its unconditional
    branch towards its conditional one (``cond + scale * (cond - uncond)`` style, as the model
    defines it; ``None``: the model's default). Models without those parts refuse them
    (:func:`check_model_fields`). ``seed`` makes a request reproducible on its own, whatever
    else is in the batch; ``None`` draws a fresh seed.
    """

    temperature: float = 1.0
    top_k: int = 250
    top_p: float = 1.0
    seed: int | None = None
    repetition_penalty: float = 1.0
    min_p: float = 0.0
    stop_ids: tuple[int, ...] = ()
    fine_temperature: float | None = None
    guidance_scale: float | None = None

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError("temperature must be >= 0")
        if self.fine_temperature is not None and self.fine_temperature < 0:
            raise ValueError("fine_temperature must be >= 0")
        if self.guidance_scale is not None and not 0 <= self.guidance_scale <= 100:
            raise ValueError("guidance_scale must be in [0, 100]")
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


MODEL_SAMPLING_FIELDS = ("fine_temperature", "guidance_scale")
"""The :class:`SamplingParams` fields only some models take; each model declares its own."""


class UnsupportedSamplingField(ValueError):
    """A request set a model-specific sampling field its model does not take. ``field``: the
    first such field, by name."""

    def __init__(self, field: str, model_name: str, declared: frozenset[str]) -> None:
        takes = ", ".join(sorted(declared)) or "none of them"
        super().__init__(
            f"{field}: {model_name} does not take this sampling field "
            f"(its model-specific fields: {takes})"
        )
        self.field = field


def check_model_fields(sampling: SamplingParams, declared: frozenset[str], model_name: str) -> None:
    """Raise :class:`UnsupportedSamplingField` when ``sampling`` sets a field of
    :data:`MODEL_SAMPLING_FIELDS` outside ``declared`` (the fields the model takes)."""
    for name in MODEL_SAMPLING_FIELDS:
        if getattr(sampling, name) is not None and name not in declared:
            raise UnsupportedSamplingField(name, model_name, declared)
