"""Sampling settings refuse what no sampler can use, and a model's own fields are refused by
name where the model does not declare them."""

from __future__ import annotations

import pytest

from cadenza.contract.sampling import (
    MODEL_SAMPLING_FIELDS,
    SamplingParams,
    UnsupportedSamplingField,
    check_model_fields,
)


@pytest.mark.parametrize(
    "fields",
    [
        {"temperature": -0.1},
        {"top_k": -1},
        {"top_p": 0.0},
        {"min_p": 1.0},
        {"repetition_penalty": 0.0},
        {"stop_ids": (-1,)},
        {"fine_temperature": -1.0},
        {"guidance_scale": -0.5},
        {"guidance_scale": 100.5},
    ],
)
def test_impossible_settings_are_refused(fields: dict[str, object]) -> None:
    with pytest.raises(ValueError, match=next(iter(fields))):
        SamplingParams(**fields)  # type: ignore[arg-type]


def test_each_model_specific_field_is_refused_by_name_unless_declared() -> None:
    for name in MODEL_SAMPLING_FIELDS:
        sampling = SamplingParams(**{name: 1.5})  # type: ignore[arg-type]
        with pytest.raises(UnsupportedSamplingField, match=f"^{name}: tiny does not take") as e:
            check_model_fields(sampling, frozenset(), "tiny")
        assert e.value.field == name
        check_model_fields(sampling, frozenset({name}), "tiny")
    check_model_fields(SamplingParams(), frozenset(), "tiny")
