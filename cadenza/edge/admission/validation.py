"""Validation limits in one place, for every transport: model, voice, text, duration, and the
model-specific sampling fields the served model takes.

Each check raises :class:`InvalidRequest`, which carries what an API error needs: an HTTP status,
a machine-readable ``code`` and the offending ``param``.
"""

from __future__ import annotations

from collections.abc import Sequence

from cadenza.config import LimitsConfig
from cadenza.contract.sampling import (
    SamplingParams,
    UnsupportedSamplingField,
    check_model_fields,
)


class InvalidRequest(ValueError):
    """A request the edge refuses with 400: ``code`` says why, ``param`` names the field."""

    def __init__(self, message: str, *, code: str, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.param = param


def validate_synthesis(
    *,
    model: str,
    text: str,
    voice: str,
    max_duration_s: float | None,
    served_model: str,
    voices: Sequence[str],
    limits: LimitsConfig,
    text_to_come: bool = False,
    sampling: SamplingParams | None = None,
    sampling_fields: Sequence[str] = (),
) -> None:
    """Raise :class:`InvalidRequest` for the first problem found, else return ``None``.
    ``text_to_come``: a text stream's first piece, which may be empty. ``sampling``: the
    request's settings, whose model-specific fields must be among ``sampling_fields`` (the
    served model's; code ``unsupported_sampling_field``)."""
    if model != served_model:
        raise InvalidRequest(
            f"model {model!r} is not served here; available: {served_model!r}",
            code="model_not_found",
            param="model",
        )
    if voice not in voices:
        raise InvalidRequest(
            f"voice {voice!r} is not available for {served_model!r}; voices: {', '.join(voices)}",
            code="voice_not_found",
            param="voice",
        )
    if not text.strip() and not text_to_come:
        raise InvalidRequest("input must not be empty", code="empty_input", param="input")
    if len(text) > limits.max_input_chars:
        raise InvalidRequest(
            f"input is {len(text)} characters; the limit is {limits.max_input_chars}",
            code="input_too_long",
            param="input",
        )
    if max_duration_s is not None and not 0 < max_duration_s <= limits.max_duration_s:
        raise InvalidRequest(
            f"max_duration_s must be in (0, {limits.max_duration_s}]",
            code="invalid_duration",
            param="max_duration_s",
        )
    if sampling is not None:
        try:
            check_model_fields(sampling, frozenset(sampling_fields), served_model)
        except UnsupportedSamplingField as exc:
            raise InvalidRequest(
                str(exc), code="unsupported_sampling_field", param=exc.field
            ) from exc
